"""What every unit test may use: a one-rank process group (one fixture for every module that needs a group),
and the unit tests' own job-record store, never the machine's (``~/.cache/torchhpc``). A unit test that reads a job
back through a fake scheduler found the dev cluster's real job 5 there (the suite's soak had left its record and
end marker), and the marker won over the fake's answer."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _own_record_store(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    if "TORCHHPC_STATE_DIR" not in os.environ:  # a test (or clean_user_env) may set its own
        monkeypatch.setenv("TORCHHPC_STATE_DIR", str(Path(tmp_path_factory.getbasetemp()) / "unit-state"))


@pytest.fixture
def one_rank_group() -> Iterator[None]:
    """This process as rank 0 of a one-rank gloo group on an in-memory store, where a test needs a group (torch
    imported by the test that asks). An async checkpoint still talking over it ends before the group does."""
    import torch.distributed as dist

    from torchhpc.dist import checkpoint

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        checkpoint.wait()
        dist.destroy_process_group()
