"""torchhpc.dist.checkpoint: DCP directories, atomic publish, keep-K, async saves, old files, bit-identical resume.

Single process, CPU (rank 0 of 1; a one-rank gloo group where DDP is needed). The
atomicity tests kill a real child process with SIGKILL while its checkpoint is half
written. Multi-rank DDP/FSDP2, resharding and random kills: tests/integration/test_checkpoint_fsdp.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import need

torch = need("torch")

from tests import legacy_checkpoint  # noqa: E402
from torchhpc.dist import checkpoint  # noqa: E402
from torchhpc.dist.context import checkpoint_group  # noqa: E402
from torchhpc.dist.teardown import run_before_teardown  # noqa: E402
from torchhpc.errors import UsageError  # noqa: E402


def _make() -> tuple[Any, Any, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Dropout(0.2), torch.nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    return model, opt, sched


def _train(model: Any, opt: Any, sched: Any, start: int, stop: int) -> None:
    """Each step draws from the global RNG (data noise, dropout): a lost RNG state changes the result."""
    import random

    import numpy as np

    for _ in range(start, stop):
        x = torch.randn(4, 8) + float(np.random.rand()) + random.random()
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()


def _params(model: Any) -> dict[str, Any]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def _names(d: Path) -> list[str]:
    return [p.name for p in checkpoint.list_checkpoints(d)]


@pytest.mark.parametrize("blocking", [True, False])
def test_resume_is_bit_identical_to_an_uninterrupted_run(tmp_path: Path, blocking: bool) -> None:
    import random

    import numpy as np

    random.seed(1)
    np.random.seed(1)
    model, opt, sched = _make()
    _train(model, opt, sched, 0, 12)
    expected = _params(model)

    random.seed(1)
    np.random.seed(1)
    model, opt, sched = _make()
    _train(model, opt, sched, 0, 5)
    r = checkpoint.save(tmp_path, step=5, model=model, optimizer=opt, scheduler=sched, blocking=blocking,
                        epoch=2, batch=17)
    path = r if blocking else r.wait()
    assert path == tmp_path / "ckpt-000000005" and path.is_dir()
    assert (path / ".metadata").is_file() and (path / checkpoint.META).is_file()
    # Move every RNG and the model on, as a killed job would have done before the restart.
    _train(model, opt, sched, 5, 7)
    torch.rand(100)
    random.random()
    np.random.rand(7)

    model2, opt2, sched2 = _make()  # a fresh process would build these from scratch
    state = checkpoint.resume(tmp_path, model=model2, optimizer=opt2, scheduler=sched2)
    assert state["step"] == 5 and state["epoch"] == 2 and state["batch"] == 17
    assert state["path"] == str(tmp_path / "ckpt-000000005")
    assert sched2.last_epoch == 5
    _train(model2, opt2, sched2, 5, 12)
    got = _params(model2)
    assert got.keys() == expected.keys()
    for k in got:
        assert torch.equal(got[k], expected[k]), k


def test_async_save_snapshots_the_state_at_the_call(tmp_path: Path) -> None:
    """Training goes on while the write runs: what is written is the state when save() was called."""
    model, opt, sched = _make()
    _train(model, opt, sched, 0, 2)
    at_save = _params(model)
    handle = checkpoint.save(tmp_path, step=2, model=model, optimizer=opt, blocking=False)
    assert isinstance(handle, checkpoint.AsyncSave) and handle.step == 2
    with torch.no_grad():
        for prm in model.parameters():
            prm.add_(1.0)  # in place, at once: the staged copy must not see it
    assert handle.wait() == tmp_path / "ckpt-000000002" and handle.done()
    model2, opt2, _ = _make()
    checkpoint.resume(tmp_path, model=model2, optimizer=opt2)
    for k, v in _params(model2).items():
        assert torch.equal(v, at_save[k]), k


def test_one_save_in_flight_the_next_save_and_resume_wait(tmp_path: Path) -> None:
    model, opt, _ = _make()
    first = checkpoint.save(tmp_path, step=1, model=model, optimizer=opt, blocking=False)
    second = checkpoint.save(tmp_path, step=2, model=model, optimizer=opt, blocking=False)
    assert first.done()  # the second save began only after the first was complete
    assert checkpoint.resume(tmp_path, model=model, optimizer=opt)["step"] == 2
    assert second.done()
    assert _names(tmp_path) == ["ckpt-000000001", "ckpt-000000002"]


def test_async_saves_go_on_where_torchs_stager_closes_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch 2.11 (the H200's CUDA build, 2026-11-30): ``DefaultStager._stage`` closes its StateDictStager at
    the end of every copy, so the second async save of a process failed with ``KeyError: <class 'type'>``
    (benchmarks/gpu_checkpoint.py, checkpoint_cost.py --device cuda). torch 2.13 here keeps it open: its
    ``_stage`` is made to close the same way, as 2.11's source does; three saves in a row must still resume."""
    from torch.distributed.checkpoint.staging import DefaultStager


    stage = DefaultStager._stage

    def closing(self: Any, state_dict: Any, **kwargs: Any) -> Any:
        try:
            return stage(self, state_dict, **kwargs)
        finally:
            self._state_dict_stager.close()

    monkeypatch.setattr(DefaultStager, "_stage", closing)
    monkeypatch.setattr(checkpoint.default(), "_stager", None)
    model, opt, sched = _make()
    for step in (1, 2, 3):
        _train(model, opt, sched, step - 1, step)
        checkpoint.save(tmp_path, step=step, model=model, optimizer=opt, blocking=False).wait()
    model2, opt2, _ = _make()
    assert checkpoint.resume(tmp_path, model=model2, optimizer=opt2)["step"] == 3
    for k, v in _params(model2).items():
        assert torch.equal(v, _params(model)[k]), k


def test_an_async_error_is_raised_by_wait(tmp_path: Path) -> None:
    model, _, _ = _make()
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(Exception):  # noqa: B017  # the directory cannot be made: raised now or by wait()
        checkpoint.save(tmp_path / "file" / "ck", step=1, model=model, blocking=False).wait()
    checkpoint.wait()  # nothing left in flight
    assert checkpoint.save(tmp_path / "ok", step=1, model=model) == tmp_path / "ok" / "ckpt-000000001"


def test_resume_without_checkpoints_is_a_fresh_start(tmp_path: Path) -> None:
    assert checkpoint.resume(tmp_path / "none") == {}
    assert checkpoint.latest(tmp_path) is None


def test_keeps_the_last_k(tmp_path: Path) -> None:
    model, opt, _ = _make()
    for step in (1, 2, 3, 4, 5):
        checkpoint.save(tmp_path, step=step, model=model, optimizer=opt, keep=2, blocking=step % 2 == 0)
    checkpoint.wait()
    assert _names(tmp_path) == ["ckpt-000000004", "ckpt-000000005"]
    assert checkpoint.latest(tmp_path) == tmp_path / "ckpt-000000005"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-000000004", "ckpt-000000005"]  # nothing else left


def test_an_incomplete_directory_is_not_a_checkpoint(tmp_path: Path) -> None:
    model, opt, _ = _make()
    checkpoint.save(tmp_path, step=1, model=model, optimizer=opt)
    (tmp_path / "ckpt-000000009").mkdir()  # a name without DCP's .metadata: not ours, not complete
    (tmp_path / ".ckpt-000000002.abc.tmp").mkdir()  # a save that was killed
    assert _names(tmp_path) == ["ckpt-000000001"]
    assert checkpoint.resume(tmp_path, model=model, optimizer=opt)["step"] == 1
    checkpoint.save(tmp_path, step=2, model=model, optimizer=opt)
    assert not (tmp_path / ".ckpt-000000002.abc.tmp").exists()  # the next save clears it


def test_ddp_saves_under_plain_names_and_resumes_into_a_plain_model(tmp_path: Path, one_rank_group: None) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    model, opt, _ = _make()
    ddp = DDP(model)
    _train(ddp, opt, torch.optim.lr_scheduler.StepLR(opt, 3), 0, 2)
    checkpoint.save(tmp_path, step=2, model=ddp, optimizer=opt, blocking=False).wait()
    plain, opt2, _ = _make()
    assert checkpoint.resume(tmp_path, model=plain, optimizer=opt2)["step"] == 2
    for k, v in plain.state_dict().items():
        assert torch.equal(v, model.state_dict()[k]), k
    assert checkpoint_group() is not None


def test_the_checkpoint_group_is_its_own_and_outlives_no_default_group() -> None:
    import torch.distributed as dist

    assert checkpoint_group() is None  # no process group, no checkpoint group
    for _ in range(2):  # a group destroyed with its default group is made anew for the next one
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        try:
            group = checkpoint_group()
            assert group is not None and group is not dist.group.WORLD and checkpoint_group() is group
            assert dist.get_backend(group) == "gloo"
        finally:
            dist.destroy_process_group()


def test_whole_tensors_are_dealt_out_once_and_evenly_for_async_copies() -> None:
    """Each rank stages only its share of the tensors every rank holds whole (DDP): together exactly all of
    them, each once, the bytes about even; everything that is not a plain tensor stays on every rank."""
    from torchhpc.dist.checkpoint_state import share, state_of

    class Odd(torch.Tensor):  # a subclass (as ShardedTensor is): per-rank data, never dealt out
        pass

    model, opt, sched = _make()
    _train(model, opt, sched, 0, 1)
    state = {**state_of(model, opt), "odd": torch.zeros(3).as_subclass(Odd)}

    def leaves(node: Any, where: tuple[Any, ...] = ()) -> dict[tuple[Any, ...], Any]:
        if isinstance(node, dict):
            return {k: v for key, sub in node.items() for k, v in leaves(sub, (*where, key)).items()}
        return {where: node}

    everything = leaves(state)
    shares = [leaves(share(state, r, 3)) for r in range(3)]
    plain = {k for k, v in everything.items() if type(v) is torch.Tensor}
    for k in plain:
        assert sum(k in sh for sh in shares) == 1, k
    for k in set(everything) - plain:
        assert all(k in sh for sh in shares), k
    sizes = [sum(v.numel() * v.element_size() for k, v in sh.items() if k in plain) for sh in shares]
    assert max(sizes) - min(sizes) <= max(v.numel() * v.element_size() for k, v in everything.items() if k in plain)


def test_init_of_an_nccl_job_makes_the_cpu_group_async_saves_need(monkeypatch: pytest.MonkeyPatch) -> None:
    """An NCCL job gets its gloo group from init(), at one point on every rank (seen here through an adopted
    group whose backend reads as nccl: there is no NCCL on this machine)."""
    import torch.distributed as dist

    import torchhpc.dist as thd
    from torchhpc.dist import context

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl" if group is None else "gloo")
        monkeypatch.setattr(context, "_CONTEXT", None)
        monkeypatch.setattr(context, "_CHECKPOINT_GROUP", None)
        ctx = thd.init(env={})
        assert ctx.backend == "nccl" and context._CHECKPOINT_GROUP is not None
        assert checkpoint_group() is context._CHECKPOINT_GROUP
    finally:
        context._CONTEXT = None
        dist.destroy_process_group()


def test_a_damaged_newest_checkpoint_falls_back_to_the_previous(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model, opt, _ = _make()
    checkpoint.save(tmp_path, step=1, model=model, optimizer=opt)
    checkpoint.save(tmp_path, step=2, model=model, optimizer=opt)
    for shard in (tmp_path / "ckpt-000000002").glob("*.distcp"):
        shard.write_bytes(shard.read_bytes()[:100])  # damaged outside our control
    assert checkpoint.resume(tmp_path, model=model, optimizer=opt)["step"] == 1
    assert f"checkpoint {tmp_path / 'ckpt-000000002'} not loaded" in capsys.readouterr().err  # said, not silent


def test_a_model_saved_alone_resumes_with_an_optimizer_given(tmp_path: Path) -> None:
    model, opt, _ = _make()
    _train(model, opt, torch.optim.lr_scheduler.StepLR(opt, 3), 0, 2)
    checkpoint.save(tmp_path, step=2, model=model)
    model2, opt2, _ = _make()
    assert checkpoint.resume(tmp_path, model=model2, optimizer=opt2)["step"] == 2  # not skipped for its optimizer
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in model2.state_dict().items())
    assert opt2.state_dict()["state"] == {}  # nothing to restore: the optimizer starts fresh, as before


def test_an_old_single_file_checkpoint_resumes_and_the_newest_of_either_kind_wins(tmp_path: Path) -> None:
    model, opt, sched = _make()
    _train(model, opt, sched, 0, 3)
    legacy_checkpoint.save(tmp_path, step=3, model=model, optimizer=opt, scheduler=sched, epoch=1)
    expected = _params(model)
    assert _names(tmp_path) == ["ckpt-000000003.pt"]
    model2, opt2, sched2 = _make()
    state = checkpoint.resume(tmp_path, model=model2, optimizer=opt2, scheduler=sched2)
    assert state["step"] == 3 and state["epoch"] == 1 and sched2.last_epoch == 3
    for k, v in _params(model2).items():
        assert torch.equal(v, expected[k]), k
    assert opt2.state_dict()["state"][0]["step"] == opt.state_dict()["state"][0]["step"]

    checkpoint.save(tmp_path, step=2, model=model, optimizer=opt)  # older than the file: the file still wins
    assert checkpoint.resume(tmp_path, model=model2)["step"] == 3
    checkpoint.save(tmp_path, step=3, model=model, optimizer=opt, epoch=9)  # same step: the directory wins
    assert _names(tmp_path)[-2:] == ["ckpt-000000003.pt", "ckpt-000000003"]
    assert checkpoint.resume(tmp_path, model=model2)["epoch"] == 9


def test_the_supervisor_hears_of_completed_checkpoints_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    job = tmp_path / "job"
    job.mkdir()
    monkeypatch.setenv("TORCHHPC_JOB_DIR", str(job))
    model, _, _ = _make()
    before = time.time()
    checkpoint.save(tmp_path / "ck", step=4, model=model)
    handle = checkpoint.save(tmp_path / "ck", step=5, model=model, blocking=False)
    handle.wait()
    marker = json.loads((job / "checkpoint.json").read_text())
    assert marker["step"] == 5 and marker["path"] == str(tmp_path / "ck" / "ckpt-000000005")
    assert [(s, tier) for s, _, tier in marker["completed"]] == [(4, "disk"), (5, "disk")]
    assert before <= marker["completed"][0][1] <= marker["completed"][1][1] == marker["time"] <= time.time()


def test_optimizer_without_model_is_refused(tmp_path: Path) -> None:
    _, opt, _ = _make()
    with pytest.raises(UsageError, match="without model"):
        checkpoint.save(tmp_path, step=1, optimizer=opt)


def test_teardown_and_exit_wait_for_the_save_in_flight(tmp_path: Path) -> None:
    model, _, _ = _make()
    handle = checkpoint.save(tmp_path, step=1, model=model, blocking=False)
    run_before_teardown()  # what torchhpc.dist.cleanup() calls before destroying the group
    assert handle.done() and checkpoint.latest(tmp_path) == tmp_path / "ckpt-000000001"


EXITS_AT_ONCE = textwrap.dedent(
    """
    import sys, torch
    from torchhpc.dist import checkpoint
    model = torch.nn.Linear(512, 512)
    checkpoint.save(sys.argv[1], step=7, model=model, blocking=False)
    print("returned", flush=True)
    """
)


def test_the_process_end_waits_for_an_async_save(tmp_path: Path) -> None:
    cp = subprocess.run([sys.executable, "-c", EXITS_AT_ONCE, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0 and "returned" in cp.stdout, cp.stderr
    assert _names(tmp_path) == ["ckpt-000000007"]
    model = torch.nn.Linear(512, 512)
    assert checkpoint.resume(tmp_path, model=model)["step"] == 7


CHILD = textwrap.dedent(
    """
    import os, sys, time, torch
    from torchhpc.dist import checkpoint
    d, ready, blocking = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
    model = torch.nn.Linear(256, 256)
    checkpoint.save(d, step=1, model=model)
    real = os.fsync
    def slow(fd):  # a slow filesystem: the bytes are written, not yet durable
        open(ready, "w").close()
        time.sleep(60)
        real(fd)
    os.fsync = slow
    with torch.no_grad():
        model.weight.add_(1.0)
    checkpoint.save(d, step=2, model=model, blocking=blocking, big=torch.zeros(4_000_000))
    time.sleep(60)
    """
)


@pytest.mark.parametrize("blocking", [True, False])
def test_sigkill_during_save_leaves_the_previous_checkpoint_loadable(tmp_path: Path, blocking: bool) -> None:
    d, ready = tmp_path / "ckpt", tmp_path / "ready"
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(d), str(ready), "1" if blocking else "0"])
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert child.poll() is None, "the child died before its second save"
            assert time.monotonic() < deadline, "the child never reached its second save"
            time.sleep(0.05)
        tmp = list(d.glob(".ckpt-000000002.*.tmp"))
        assert tmp and any(f.stat().st_size > 0 for f in tmp[0].iterdir())  # killed with a partial checkpoint
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == -signal.SIGKILL
    assert _names(d) == ["ckpt-000000001"]
    model = torch.nn.Linear(256, 256)
    state = checkpoint.resume(d, model=model)
    assert state["step"] == 1
    assert not torch.equal(model.weight, torch.nn.Linear(256, 256).weight)
    # The next successful save clears the stale temporary directory.
    checkpoint.save(d, step=3, model=model)
    assert not list(d.glob(".ckpt-*"))
    assert _names(d) == ["ckpt-000000001", "ckpt-000000003"]
