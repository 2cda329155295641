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
    """``-D``: every run of a requeued job, each its own row (without it, only the last run's)."""
    return ["sacct", "-X", "-D", "-n", "-P", "-j", job_id, "-o", TIMES_FIELDS]


def _reason(text: str, when: Optional[float]) -> tuple[tuple[float, str], ...]:
    if not text or text in ("None", "(null)") or when is None:
        return ()
    return ((when, text),)


def _runs(rows: list[list[str]]) -> list[list[list[str]]]:
    """The rows of each run: a run ends with a REQUEUED row (requeued jobs, ``-D``); a resized run (a node
    lost under ``--no-kill``) has a row per size, RESIZING then its last."""
    runs: list[list[list[str]]] = [[]]
    for row in rows:
        runs[-1].append(row)
        if row[5].split()[0:1] == ["REQUEUED"]:
            runs.append([])
    return [r for r in runs if r]


def times_from_sacct(text: str, job_id: str) -> Optional[JobTimes]:
    """The job's rows of ``sacct -X -D -n -P -o TIMES_FIELDS`` (None: no row for it).

    Submit is the first run's (a requeued job's first submission, issue 70), Eligible and Start the last
    run's (the supervisor's ``attempts.json`` places the earlier ones), End and state its last row's; each
    earlier run is a row of ``reasons``: when it ended, that it was requeued, where it had run."""
    rows = [p for p in (line.split("|", 9) for line in text.splitlines()) if len(p) >= 10 and p[0] == job_id]
    if not rows:
        return None
    runs = _runs(rows)
    first, parts = runs[-1][0], rows[-1]
    _id, _sub, eligible, start, _e, _s, _c, _n, reason, _name = first
    _id, _sub, _elig, _start, end, state, code, nodes, _r, _name = parts
    sub = clock(rows[0][1])
    earlier = tuple((when, f"requeued: its run {i + 1} on {run[-1][7]} ({run[0][3][11:]} to {run[-1][4][11:]}) "
                           "ended, the job waited again")
                    for i, run in enumerate(runs[:-1]) for when in [clock(run[-1][4])] if when is not None)
    return JobTimes(
        submit=sub, eligible=clock(eligible), start=clock(start), end=clock(end),
        state=state.split()[0] if state else "UNKNOWN", exit_code=exit_code_of(code),
        nodes="" if nodes in ("None assigned", "(null)") else nodes,
        reasons=earlier + _reason(reason, clock(eligible) or sub), source="sacct",
        runs=tuple((b, e, run[-1][7]) for run in runs[:-1] for b, e in [(clock(run[0][3]), clock(run[-1][4]))]
                   if b is not None and e is not None),
        raw=dict(zip(TIMES_FIELDS.split(","), parts)),
    )


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
