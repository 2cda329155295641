"""torchhpc.dist.checkpoint: atomic writes, keep-K, and a resume that is bit-identical.

Single process, CPU, no process group (rank 0 of 1). The atomicity test kills a
real child process with SIGKILL while its checkpoint file is half written.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from tests.conftest import need

torch = need("torch")

from torchhpc.dist import checkpoint  # noqa: E402


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


def test_resume_is_bit_identical_to_an_uninterrupted_run(tmp_path: Path) -> None:
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
    path = checkpoint.save(tmp_path, step=5, model=model, optimizer=opt, scheduler=sched, epoch=2, batch=17)
    assert path is not None and path.name == "ckpt-000000005.pt"
    # Move every RNG and the model on, as a killed job would have done before the restart.
    torch.rand(100)
    random.random()
    np.random.rand(7)

    model2, opt2, sched2 = _make()  # a fresh process would build these from scratch
    state = checkpoint.resume(tmp_path, model=model2, optimizer=opt2, scheduler=sched2)
    assert state["step"] == 5 and state["epoch"] == 2 and state["batch"] == 17
    assert sched2.last_epoch == 5
    _train(model2, opt2, sched2, 5, 12)
    got = _params(model2)
    assert got.keys() == expected.keys()
    for k in got:
        assert torch.equal(got[k], expected[k]), k


def test_resume_without_checkpoints_is_a_fresh_start(tmp_path: Path) -> None:
    assert checkpoint.resume(tmp_path / "none") == {}
    assert checkpoint.latest(tmp_path) is None


def test_keeps_the_last_k(tmp_path: Path) -> None:
    model, opt, _ = _make()
    for step in (1, 2, 3, 4, 5):
        checkpoint.save(tmp_path, step=step, model=model, optimizer=opt, keep=2)
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == ["ckpt-000000004.pt", "ckpt-000000005.pt"]
    assert checkpoint.latest(tmp_path) == tmp_path / "ckpt-000000005.pt"
    assert not list(tmp_path.glob(".ckpt-*"))  # no temporary file left behind


def test_ddp_style_wrapper_saves_the_inner_module(tmp_path: Path) -> None:
    model, _, _ = _make()

    class Wrapper(torch.nn.Module):  # type: ignore[name-defined,misc]  # what DDP looks like from the outside: .module
        def __init__(self, m: Any) -> None:
            super().__init__()
            self.module = m

    checkpoint.save(tmp_path, step=1, model=Wrapper(model))
    payload = torch.load(tmp_path / "ckpt-000000001.pt", weights_only=False)
    assert set(payload["model"]) == set(model.state_dict())


def test_a_damaged_newest_checkpoint_falls_back_to_the_previous(tmp_path: Path) -> None:
    model, opt, _ = _make()
    checkpoint.save(tmp_path, step=1, model=model, optimizer=opt)
    checkpoint.save(tmp_path, step=2, model=model, optimizer=opt)
    newest = tmp_path / "ckpt-000000002.pt"
    newest.write_bytes(newest.read_bytes()[:100])  # damaged outside our control
    assert checkpoint.resume(tmp_path, model=model, optimizer=opt)["step"] == 1


CHILD = textwrap.dedent(
    """
    import os, sys, time, torch
    from torchhpc.dist import checkpoint
    d, ready = sys.argv[1], sys.argv[2]
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
    checkpoint.save(d, step=2, model=model, big=torch.zeros(4_000_000))
    """
)


def test_sigkill_during_save_leaves_the_previous_checkpoint_loadable(tmp_path: Path) -> None:
    d, ready = tmp_path / "ckpt", tmp_path / "ready"
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(d), str(ready)])
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert child.poll() is None, "the child died before its second save"
            assert time.monotonic() < deadline, "the child never reached its second save"
            time.sleep(0.05)
        tmp = list(d.glob(".ckpt-000000002.pt.tmp-*"))
        assert tmp and tmp[0].stat().st_size > 0  # killed with a partial new checkpoint on disk
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == -signal.SIGKILL
    assert [p.name for p in checkpoint.list_checkpoints(d)] == ["ckpt-000000001.pt"]
    model = torch.nn.Linear(256, 256)
    state = checkpoint.resume(d, model=model)
    assert state["step"] == 1
    payload = torch.load(d / "ckpt-000000001.pt", weights_only=False)
    assert torch.equal(model.weight, payload["model"]["weight"])
    # The next successful save clears the stale temporary file.
    checkpoint.save(d, step=3, model=model)
    assert not list(d.glob(".ckpt-*"))
    assert [p.name for p in checkpoint.list_checkpoints(d)] == ["ckpt-000000001.pt", "ckpt-000000003.pt"]
