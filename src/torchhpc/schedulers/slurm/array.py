"""Slurm job arrays seen as one job: per-task states from scontrol (then sacct), summarised.

``scontrol show job -o ARRAY`` prints one line per task that has started and one line for
the tasks still pending (``ArrayTaskId=2-3%2``); ``sacct -X`` prints ``ARRAY_TASK`` rows
(pending ones as ``ARRAY_[2-3%2]``). One task is addressed as ``ARRAY_TASK`` (``123_4``),
which scontrol, sacct and scancel all understand.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable

from torchhpc.core.array import parse_array
from torchhpc.schedulers.api import TERMINAL, JobStatus
from torchhpc.schedulers.slurm.parse import exit_code_of

__all__ = ["summarise", "tasks_from_sacct", "tasks_from_scontrol"]


def _expand(task_text: str) -> list[int]:
    """``3`` -> [3]; ``2-3%2`` / ``[2-3%2]`` / ``4,6`` -> their indices; junk -> []."""
    text = task_text.strip("[]")
    try:
        return list(parse_array(text).indices)
    except Exception:
        return []


def tasks_from_scontrol(array_id: str, text: str, parse: Callable[[str], dict[str, str]],
                        one: Callable[[str, dict[str, str]], JobStatus]) -> list[JobStatus]:
    """One :class:`JobStatus` per task (``job_id`` = ``ARRAY_TASK``), from ``scontrol show job -o``."""
    out: dict[int, JobStatus] = {}
    for line in text.splitlines():
        fields = parse(line)
        if fields.get("ArrayJobId") != array_id or "ArrayTaskId" not in fields:
            continue
        for index in _expand(fields["ArrayTaskId"]):
            out[index] = one(f"{array_id}_{index}", fields)
    return [out[i] for i in sorted(out)]


def tasks_from_sacct(array_id: str, text: str) -> list[JobStatus]:
    """From ``sacct -X -n -P -o JobID,State,ExitCode,Elapsed,NodeList,JobName``."""
    out: dict[int, JobStatus] = {}
    for line in text.splitlines():
        parts = line.split("|", 5)
        if len(parts) != 6:
            continue
        m = re.fullmatch(re.escape(array_id) + r"_(\S+)", parts[0])
        if not m:
            continue
        state = parts[1].split()[0] if parts[1] else "UNKNOWN"
        for index in _expand(m.group(1)):
            out[index] = JobStatus(f"{array_id}_{index}", state, exit_code_of(parts[2]), "", parts[3], parts[5], parts[4])
    return [out[i] for i in sorted(out)]


def summarise(array_id: str, tasks: list[JobStatus]) -> JobStatus:
    """The array as one job: RUNNING/PENDING while a task is not done, else COMPLETED only when
    every task completed with exit 0, else FAILED; the reason counts states and names failed tasks."""
    counts = Counter(t.state for t in tasks)
    failed = [t for t in tasks if t.terminal and not t.ok]
    if any(not t.terminal for t in tasks):
        state = "RUNNING" if any(t.state != "PENDING" and not t.terminal for t in tasks) else "PENDING"
    else:
        state = "FAILED" if failed else "COMPLETED"
    reason = f"{len(tasks)} tasks: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    if failed:
        reason += "; failed: " + ", ".join(
            t.job_id.rsplit("_", 1)[-1] + (f" (exit {t.exit_code})" if t.exit_code else f" ({t.state})") for t in failed
        )
    exit_code = next((t.exit_code for t in failed if t.exit_code), 1 if failed else 0) if state in TERMINAL else None
    return JobStatus(
        job_id=array_id, state=state, exit_code=exit_code, reason=reason, name=tasks[0].name if tasks else "",
        restarts=sum(t.restarts for t in tasks), tasks=tasks,
    )
