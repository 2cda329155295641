"""torchhpc.dist.stop: the stop file, SIGTERM as a request, and one agreed answer for every rank."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from torchhpc.dist import stop


@pytest.fixture(autouse=True)
def fresh_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stop, "_flag", threading.Event())
    monkeypatch.delenv("TORCHHPC_STOP_FILE", raising=False)


def test_stop_file_is_seen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / ".torchhpc-stop-42"
    monkeypatch.setenv("TORCHHPC_STOP_FILE", str(f))
    assert stop.stop_requested_locally() is False
    f.touch()
    assert stop.stop_requested_locally() is True


def test_request_stop_sets_the_flag() -> None:
    assert stop.stop_requested_locally() is False
    stop.request_stop("test")
    assert stop.stop_requested_locally() is True


def test_should_stop_alone_and_every_n(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    monkeypatch.setattr(stop, "watch", lambda *a, **k: None)  # keep pytest's own SIGTERM handling
    assert stop.should_stop() is False
    stop.request_stop()
    assert stop.should_stop() is True
    assert stop.should_stop(every=5, step=3) is False  # not a synchronisation step
    assert stop.should_stop(every=5, step=10) is True


SIGTERM_CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from torchhpc.dist import stop
    stop.watch()
    os.kill(os.getpid(), signal.SIGTERM)   # preemption / torchrun shutting its workers down
    print("alive", stop.stop_requested_locally())
    """
)


def test_sigterm_becomes_a_stop_request_not_death() -> None:
    r = subprocess.run([sys.executable, "-c", SIGTERM_CHILD], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "alive True"


RANK = textwrap.dedent(
    """
    import sys, torch.distributed as dist
    from torchhpc.dist import stop
    rank, store_path = int(sys.argv[1]), sys.argv[2]
    dist.init_process_group("gloo", store=dist.FileStore(store_path, 2), rank=rank, world_size=2)
    answers = []
    for step in range(1, 7):
        if rank == 1 and step == 4:
            stop.request_stop("only rank 1 was asked")
        answers.append(stop.should_stop())
        if answers[-1]:
            break
    print(rank, step, answers, flush=True)
    dist.destroy_process_group()
    """
)


def test_all_ranks_stop_at_the_same_step(tmp_path: Path) -> None:
    """Two real gloo ranks (FileStore, no ports); only rank 1 sees the request, both stop at step 4."""
    pytest.importorskip("torch")
    store = str(tmp_path / "store")
    ranks = [
        subprocess.Popen([sys.executable, "-c", RANK, str(r), store], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for r in (0, 1)
    ]
    outs = [p.communicate(timeout=120) for p in ranks]
    for p, (_o, e) in zip(ranks, outs):
        assert p.returncode == 0, e
    assert outs[0][0].strip() == "0 4 [False, False, False, True]"
    assert outs[1][0].strip() == "1 4 [False, False, False, True]"
