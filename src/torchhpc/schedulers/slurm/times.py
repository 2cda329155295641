"""A Slurm job's own clock: one ``sacct`` row (Submit, Eligible, Start, End), else its scontrol record.

``sacct`` asks the accounting daemon, not the controller, so ``torchhpc events`` on a finished job
costs one accounting call and no controller load. Without accounting (or before slurmdbd has the
job) the scontrol fields ``status`` already reads carry the same four times.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Optional

from torchhpc.schedulers.slurm.parse import exit_code_of
from torchhpc.schedulers.times import JobTimes, clock

__all__ = ["TIMES_FIELDS", "sacct_times_argv", "times_from_sacct", "times_from_scontrol"]

# the name last: it may hold the separator
TIMES_FIELDS = "JobID,Submit,Eligible,Start,End,State,ExitCode,NodeList,Reason,JobName"


def sacct_times_argv(job_id: str) -> list[str]:
    return ["sacct", "-X", "-n", "-P", "-j", job_id, "-o", TIMES_FIELDS]


def _reason(text: str, when: Optional[float]) -> tuple[tuple[float, str], ...]:
    if not text or text in ("None", "(null)") or when is None:
        return ()
    return ((when, text),)


def times_from_sacct(text: str, job_id: str) -> Optional[JobTimes]:
    """The job's row of ``sacct -X -n -P -o TIMES_FIELDS`` (None: no row for it).

    A requeued job has one row per run in ``sacct -D`` only; ``-X`` without ``-D`` gives its last run,
    whose Submit is the requeue's: the first attempt's times then come from ``attempts.json``.
    A job that lost a node is resized: ``-X`` then gives a row per size (RESIZING, then the final
    one); its Submit, Eligible and Start are the first row's, its End and state the last row's."""
    rows = [p for p in (line.split("|", 9) for line in text.splitlines()) if len(p) >= 10 and p[0] == job_id]
    if rows:
        first, parts = rows[0], rows[-1]
        _id, submit, eligible, start, _e, _s, _c, _n, reason, _name = first
        _id, _sub, _elig, _start, end, state, code, nodes, _r, _name = parts
        sub = clock(submit)
        return JobTimes(
            submit=sub, eligible=clock(eligible), start=clock(start), end=clock(end),
            state=state.split()[0] if state else "UNKNOWN", exit_code=exit_code_of(code),
            nodes="" if nodes in ("None assigned", "(null)") else nodes,
            reasons=_reason(reason, clock(eligible) or sub), source="sacct",
            raw=dict(zip(TIMES_FIELDS.split(","), parts)),
        )
    return None


def times_from_scontrol(fields: Mapping[str, str]) -> JobTimes:
    """The same four times from ``scontrol show job -o`` fields (SubmitTime, EligibleTime, ...)."""
    sub = clock(fields.get("SubmitTime"))
    state = fields.get("JobState", "")
    pending = state == "PENDING"
    return JobTimes(
        submit=sub, eligible=clock(fields.get("EligibleTime")),
        start=None if pending else clock(fields.get("StartTime")),
        end=clock(fields.get("EndTime")) if state not in ("PENDING", "RUNNING", "CONFIGURING", "") else None,
        state=state, exit_code=exit_code_of(fields.get("ExitCode", "")), nodes=fields.get("NodeList", ""),
        reasons=_reason(fields.get("Reason", ""), clock(fields.get("EligibleTime")) or sub),
        source="scontrol", raw=dict(fields),
    )
