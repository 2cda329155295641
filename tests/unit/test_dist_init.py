"""torchhpc.dist.init()/cleanup()/print0/log0 in one process, with real torch.distributed (gloo).

Multi-process launches (torchrun, mpirun, a Popen loop) are in
tests/integration/test_dist_launch.py. The one CUDA test fakes
``torch.cuda`` because this machine has no GPU; it says so.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterator
from datetime import timedelta

import pytest

from tests.conftest import need

torch = need("torch")
import torch.distributed as dist  # noqa: E402

import torchhpc.dist as thd  # noqa: E402
from torchhpc.dist.context import DistContext  # noqa: E402
from torchhpc.dist.group import pick_device  # noqa: E402
from torchhpc.env import detect  # noqa: E402
from torchhpc.errors import EnvironmentDetectionError, UsageError  # noqa: E402


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No context or group leaks between tests; os.environ is restored."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHHPC_BACKEND", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    thd.cleanup()
    yield
    thd.cleanup()
    if dist.is_initialized():
        dist.destroy_process_group()


def test_single_process_needs_no_group_and_no_env() -> None:
    before = dict(os.environ)
    ctx = thd.init(env={})
    assert (ctx.rank, ctx.world_size, ctx.local_rank, ctx.node_rank) == (0, 1, 0, 0)
    assert ctx.is_main and ctx.device == torch.device("cpu") and ctx.backend == "gloo"
    assert not ctx.distributed and not ctx.owns_group and not dist.is_initialized()
    assert ctx.env.source == "local"
    assert dict(os.environ) == before  # a plain script's environment is left alone
    assert thd.init(env={}) is ctx and thd.current() is ctx


def test_single_group_gives_working_collectives() -> None:
    ctx = thd.init(env={}, single_group=True)
    assert ctx.distributed and ctx.owns_group and dist.get_world_size() == 1
    t = torch.tensor([3.0])
    dist.all_reduce(t)
    assert t.item() == 3.0
    ctx.barrier()
    thd.cleanup()
    assert not dist.is_initialized() and thd.current() is None
    thd.cleanup()  # idempotent


def test_context_manager_cleans_up() -> None:
    with thd.init(env={}, single_group=True) as ctx:
        assert ctx.distributed
    assert not dist.is_initialized()


def test_adopts_a_group_the_user_started() -> None:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    ctx = thd.init(env={})
    assert not ctx.owns_group and ctx.backend == "gloo" and ctx.world_size == 1
    thd.cleanup()
    assert dist.is_initialized()  # not ours to destroy


@pytest.mark.parametrize(
    ("kwargs", "environ", "needle"),
    [
        ({"backend": "nccl"}, {}, "'nccl' (from backend=) needs a CUDA device"),
        ({"backend": "infiniband"}, {}, "'infiniband' (from backend=)"),
        ({}, {"TORCHHPC_BACKEND": "bogus"}, "'bogus' (from TORCHHPC_BACKEND)"),
    ],
)
def test_bad_backend_is_named(kwargs: dict[str, str], environ: dict[str, str], needle: str) -> None:
    with pytest.raises(UsageError) as info:
        thd.init(env=environ, single_group=True, **kwargs)
    assert needle in str(info.value)
    assert thd.current() is None and not dist.is_initialized()


def test_backend_from_environment_variable() -> None:
    ctx = thd.init(env={"TORCHHPC_BACKEND": "gloo"}, single_group=True)
    assert ctx.backend == "gloo" and dist.get_backend() == "gloo"


def test_cuda_device_follows_local_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    """FAKE: no GPU here, so torch.cuda's answers are patched; the choice logic is what is tested."""
    chosen: list[object] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: chosen.append(d))
    env = detect({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "h"})
    assert pick_device(env, None) == torch.device("cuda", 1)  # local rank 3 on 2 visible GPUs
    assert chosen == [torch.device("cuda", 1)]
    assert pick_device(env, "cpu") == torch.device("cpu")


def _ctx(rank: int) -> DistContext:
    env = detect({})
    return DistContext(rank, 2, rank, 2, 0, 1, torch.device("cpu"), "gloo", env)


def test_print_and_log_only_on_rank_zero(capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="torchhpc.dist")
    _ctx(1).print("from one")
    _ctx(1).log("log from one")
    _ctx(0).print("from zero")
    _ctx(0).log("log from %s", "zero")
    assert capsys.readouterr().out == "from zero\n"
    assert [r.getMessage() for r in caplog.records] == ["log from zero"]


def test_print0_reads_the_launcher_before_init(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    thd.print0("hidden")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    thd.print0("shown")
    assert capsys.readouterr().out == "shown\n"


def test_unreachable_master_fails_with_the_address() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    with pytest.raises(EnvironmentDetectionError) as info:
        thd.init(env=env, timeout=timedelta(seconds=2), export_env=False)
    assert f"127.0.0.1:{port}" in str(info.value) and "rank 1 of 2" in str(info.value)
    assert thd.current() is None


def test_lazy_helpers_are_reachable() -> None:
    assert callable(thd.wrap) and callable(thd.main_first) and callable(thd.loader)
    with pytest.raises(AttributeError):
        thd.no_such_helper  # noqa: B018
