"""The attempts as ``status`` and ``diagnose`` show them: one line per attempt."""

from __future__ import annotations

import time
from typing import Any, Optional

from torchhpc.jobdir.attempts import shrunk
from torchhpc.supervisor.attempts import load_attempts

__all__ = ["attempt_lines", "job_attempts"]


def job_attempts(scheduler: str, job_id: str, job_dir: Optional[str] = None) -> list[dict[str, Any]]:
    """The job's ``attempts.json`` (``[]`` for a job without restarts, or unknown here); ``job_dir``
    where the record names none (a local job's directory is its scheduler's: ``end_dir``)."""
    from torchhpc.jobdir.record import read_record

    where = read_record(scheduler, job_id).job_dir or job_dir
    return load_attempts(where) if where else []


def attempt_lines(attempts: list[dict[str, Any]]) -> list[str]:
    """``attempt 0 node1,node2 02:44:14-02:45:11 node-failure (excluded node2)``."""
    out = []
    full = max((int(a["world_size"]) for a in attempts if a.get("world_size")), default=0)
    for a in attempts:
        start = time.strftime("%H:%M:%S", time.localtime(float(a.get("started") or 0)))
        end = time.strftime("%H:%M:%S", time.localtime(float(a["ended"]))) if a.get("ended") else "running"
        klass = a.get("class") or ("succeeded" if a.get("ended") else "")
        rank = f" rank {a['rank']}" if a.get("rank") is not None else ""
        excluded = f" (excluded {','.join(a['excluded'])})" if a.get("excluded") else ""
        out.append(f"  attempt {a.get('attempt')}: {','.join(a.get('nodes') or [])}{shrunk(a, full)} {start}-{end} "
                   f"{klass}{rank}{excluded}")
    return out
