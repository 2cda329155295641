"""The memory tier (torchhpc.dist.memtier) in this process: rank 0 of a one-rank gloo group, one "node".

The tier's peer copies need a second node and run in tests/integration/test_checkpoint_memory.py, in real rank
processes, where in-process line coverage does not see them; here is what one rank does on its own: its saves
to shared memory, the older one dropped, the resume from memory (bit-identical), and the write to disk at the
job's end (the supervisor's, on the local scheduler's allocation) with the tier freed after it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import need

torch = need("torch")

from torchhpc.dist import checkpoint  # noqa: E402
from torchhpc.dist.memtier import NODE_ENV, tier_root  # noqa: E402
from torchhpc.jobdir.shm import SHM_ENV, free, persist  # noqa: E402
from torchhpc.schedulers import get_scheduler  # noqa: E402
from torchhpc.supervisor.memtier import free_memory  # noqa: E402

JOB = "4242"


@pytest.fixture
def one_rank(one_rank_group: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A one-rank group (tests/unit/conftest.py) in job 4242 on node n0, its shared memory under ``tmp_path/shm``."""
    for var in ("PBS_JOBID", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", JOB)
    monkeypatch.setenv(NODE_ENV, "n0")
    monkeypatch.setenv(SHM_ENV, str(tmp_path / "shm"))
    try:
        yield tmp_path / "shm"
    finally:
        checkpoint.wait()
        free(JOB, str(tmp_path / "shm"))


def _model(seed: int) -> tuple[Any, Any]:
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def _step(model: Any, opt: Any) -> None:
    opt.zero_grad()
    model(torch.randn(5, 4)).pow(2).sum().backward()
    opt.step()


def test_a_memory_save_resumes_bit_identical_and_lands_on_disk_at_the_end(one_rank: Path, tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    model, opt = _model(0)
    _step(model, opt)
    checkpoint.save(ck, step=1, model=model, optimizer=opt)  # the disk tier, every k steps
    for step in (2, 3):
        _step(model, opt)
        checkpoint.save(ck, step=step, model=model, optimizer=opt, tier="memory")
    checkpoint.wait()
    node = tier_root(ck)  # <shm>/torchhpc-<job>-<dir key>/<node>
    assert node.name == "n0" and node.parent.parent == one_rank and node.parent.name.startswith(f"torchhpc-{JOB}-")
    assert sorted(p.name for p in node.iterdir() if p.name.startswith("ckpt-")) == ["ckpt-000000003"]  # 2 dropped
    assert sorted(p.name for p in ck.iterdir()) == ["ckpt-000000001"]  # memory saves never touch the disk

    model2, opt2 = _model(1)
    got = checkpoint.resume(ck, model=model2, optimizer=opt2)
    assert (got["step"], got["tier"]) == (3, "memory"), got
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in model2.state_dict().items())
    momentum = [s["momentum_buffer"] for s in opt.state_dict()["state"].values()]
    assert all(torch.equal(a, b["momentum_buffer"]) for a, b in zip(momentum, opt2.state_dict()["state"].values()))

    # the job's end: the supervisor runs jobdir/shm on every node of the allocation (here the local one's,
    # this machine): the newest memory save to disk, then the tier freed
    said: list[str] = []
    free_memory(get_scheduler("local").allocation_of(JOB, dict(os.environ)), dict(os.environ), JOB, said.append)
    assert said == [f"the memory tier's newest checkpoint is on disk: {ck / 'ckpt-000000003'}"], said
    assert not list(one_rank.iterdir()) and persist(JOB, str(one_rank)) == []
    model3, opt3 = _model(2)
    got = checkpoint.resume(ck, model=model3, optimizer=opt3)
    assert (got["step"], got["tier"]) == (3, "disk"), got
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in model3.state_dict().items())
