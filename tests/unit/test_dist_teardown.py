"""Teardown under load: short real gloo jobs beside busy loops exit 0, never abort, leave no gloo threads.

The abort this guards against ("terminate called without an active exception",
SIGABRT at exit after all work was done) was seen a few times in 20+ full test
runs on a loaded machine. Each run here is 2-3 real ranks (torch + gloo over
loopback) that init through ``torchhpc.dist.init()``, all-reduce, and leave
through ``torchhpc.dist.cleanup()``; one run per round also wraps a model in
DDP, the path where torch 2.13 keeps the gloo group (and its threads) alive
after ``destroy_process_group()``. The heavy version is the soak::

    scripts/soak.sh -n 50 tests/unit/test_dist_teardown.py
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

RUNS = int(os.environ.get("TORCHHPC_TEARDOWN_RUNS", "3"))
GLOO_THREADS = ("pt_gloo_runloop", "gloo_tcp_loop", "pt_tcpstore_uv")
RANK = textwrap.dedent(
    """
    import os, sys
    import torch
    import torch.distributed as dist
    import torchhpc.dist as thd

    ctx = thd.init(backend="gloo")
    t = torch.full((1 << 16,), float(ctx.rank))
    dist.all_reduce(t)
    assert t[0].item() == sum(range(ctx.world_size)), t[0]
    if sys.argv[1] == "ddp":
        model = ctx.wrap(torch.nn.Linear(32, 4))
        model(torch.randn(8, 32)).sum().backward()
    thd.cleanup()
    assert not dist.is_initialized()

    def gloo_threads():
        names = []
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
        return sorted(n for n in names if n in {names!r})

    print("DONE", ctx.rank, "gloo threads after cleanup:", ",".join(gloo_threads()) or "none", flush=True)
    """
).replace("{names!r}", repr(set(GLOO_THREADS)))


@contextmanager
def busy_loops(n: int) -> Iterator[None]:
    """n processes spinning on the CPU (the load that widens teardown races); killed by PID after."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for h in hogs:
            h.kill()
            h.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_job(world: int, mode: str) -> list[tuple[int, str, str]]:
    port = free_port()
    procs = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
               "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}  # fmt: skip
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", RANK, mode],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        results.append((p.returncode, out, err))
    return results


def test_short_gloo_jobs_beside_busy_loops_leave_cleanly() -> None:
    pytest.importorskip("torch")
    problems: list[str] = []
    with busy_loops(2):
        for i in range(RUNS):
            world, mode = (2 + i % 2, "ddp" if i == RUNS - 1 else "plain")
            for rank, (rc, out, err) in enumerate(run_job(world, mode)):
                if rc != 0 or "terminate called" in err or "DONE" not in out:
                    problems.append(
                        f"run {i} ({mode}, world {world}) rank {rank} exit {rc}: {out.strip()} {err.strip()[-800:]}"
                    )
                elif mode == "plain" and not out.strip().endswith("none"):
                    problems.append(f"run {i} rank {rank}: gloo threads outlived cleanup(): {out.strip()}")
    assert not problems, "\n".join(problems)
