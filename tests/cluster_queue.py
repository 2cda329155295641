"""The dev cluster's queue, for the checks that no test leaves a job behind.

Two checks use it: each integration module's (tests/integration/conftest.py: the jobs of that module,
which under xdist are the jobs that name the worker's own temporary folder) and the run's (the
controller, tests/conftest.py: every job submitted while the run was on). Without a dev cluster both
see an empty queue.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterable

from torchhpc.devcluster import load_state

# squeue's fields, one line per job: id, state, name, command (the script's path), working directory.
FORMAT = "%i|%T|%j|%o|%Z"


def queued() -> dict[str, list[str]]:
    """Job id -> ``[state, name, command, workdir]`` of every job in the dev cluster's queue."""
    state = load_state()
    if state is None:
        return {}
    try:
        out = subprocess.run(["squeue", "-h", "-o", FORMAT], env=state.client_env(), capture_output=True,
                             text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    jobs = {}
    for line in out.splitlines():
        fields = line.split("|")
        if len(fields) == 5 and fields[0]:
            jobs[fields[0]] = fields[1:]
    return jobs


def left_in_queue(ours: Callable[[str, list[str]], bool], settle_s: float = 30) -> dict[str, str]:
    """``id -> "STATE NAME"`` of the jobs ``ours(id, fields)`` claims still queued after ``settle_s``:
    a job cancelled a moment ago leaves the queue within seconds (COMPLETING)."""
    deadline = time.monotonic() + settle_s
    while True:
        left = {j: f"{f[0]} {f[1]}" for j, f in queued().items() if ours(j, f)}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(1)


def cancel(jobs: Iterable[str]) -> None:
    state = load_state()
    if state is not None:
        subprocess.run(["scancel", *jobs], env=state.client_env(), capture_output=True, timeout=60)


def names_any(fields: list[str], paths: Iterable[str]) -> bool:
    """Whether the job's command or working directory lies under one of ``paths``."""
    return any(p and (f == p or f.startswith(p.rstrip("/") + "/")) for f in fields[2:] for p in paths)
