"""Parsers for ``qstat -f`` output: PBS Pro's ``-F json`` and the plain attribute listing.

No PBS server can be installed where torchhpc is developed, so these parsers are
written from the formats in the PBS Professional Reference Guide (``qstat``:
"Job Status Format", ``-F json``) and Torque's ``qstat -f`` man page, and tested
on outputs recorded in that format (``tests/data/pbs/``). Both parsers return
the same shape -- ``{job_id: {attribute: value}}`` with nested resources
flattened to ``Resource_List.select`` -- so the state mapping below serves both.
"""

from __future__ import annotations

import json
import re
from typing import Any

from torchhpc.errors import SchedulerError
from torchhpc.schedulers.api import JobStatus

__all__ = ["PBS_STATES", "parse_qstat_full", "parse_qstat_json", "status_from_attrs"]

# job_state letters (PBS Pro and Torque) -> our (Slurm) vocabulary.
PBS_STATES: dict[str, str] = {
    "Q": "PENDING",  # queued
    "W": "PENDING",  # waiting for its execution time
    "H": "PENDING",  # held (reason tells which hold)
    "T": "PENDING",  # in transit between servers
    "M": "PENDING",  # moved to another server
    "R": "RUNNING",
    "E": "COMPLETING",  # exiting after having run
    "B": "RUNNING",  # array job: at least one subjob started
    "S": "SUSPENDED",
    "U": "SUSPENDED",  # suspended: workstation busy
    "F": "COMPLETED",  # finished (PBS Pro history); refined by Exit_status below
    "X": "COMPLETED",  # subjob finished; refined by Exit_status
    "C": "COMPLETED",  # Torque: completed; refined by exit_status
}

# PBS Pro's JOB_EXEC_KILL_WALLTIME ("job exceeded a resource limit": walltime).
_WALLTIME_EXITS = {-29}
_SIGNAL_BASE = 256  # PBS: Exit_status = 256 + signal for a job killed by a signal


def _flatten(prefix: str, value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        return {prefix: str(value)}
    out: dict[str, str] = {}
    for k, v in value.items():
        out.update(_flatten(f"{prefix}.{k}" if prefix else str(k), v))
    return out


def parse_qstat_json(text: str) -> dict[str, dict[str, str]]:
    """``qstat -f -F json`` -> ``{job_id: {attr: value}}``.

    ``strict=False`` because PBS Pro releases before 2020 wrote raw control
    characters (tabs, newlines from the submitting shell's variables) into the
    ``Variable_List`` strings, which strict JSON rejects. ``Variable_List`` stays
    nested-flattened like the resources (``Variable_List.PBS_O_WORKDIR``).
    """
    try:
        data = json.loads(text, strict=False)
    except ValueError as e:
        raise SchedulerError(
            f"`qstat -f -F json` printed something that is not JSON ({e})",
            "run `qstat -f JOBID` by hand; an old PBS may not support -F json",
        ) from None
    jobs = data.get("Jobs") or {}
    if not isinstance(jobs, dict):
        raise SchedulerError("`qstat -F json` output has no \"Jobs\" object")
    return {job_id: _flatten("", attrs) for job_id, attrs in jobs.items()}


_JOB_ID = re.compile(r"^Job Id:\s*(\S+)")
_ATTR = re.compile(r"^\s+([A-Za-z_][\w.]*)\s=\s?(.*)$")


def parse_qstat_full(text: str) -> dict[str, dict[str, str]]:
    """Plain ``qstat -f`` -> ``{job_id: {attr: value}}``.

    The format: ``Job Id: ID`` opens a job; each attribute is an indented
    ``name = value`` line; the server wraps long values onto following lines
    that start with a tab, which continue the previous value verbatim.
    """
    out: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    last: str | None = None
    for raw in text.splitlines():
        line = raw.rstrip("\r")
        m = _JOB_ID.match(line)
        if m:
            current = out.setdefault(m.group(1), {})
            last = None
            continue
        if current is None or not line.strip():
            continue
        if line.startswith("\t") and last is not None:
            current[last] += line.strip("\t")
            continue
        a = _ATTR.match(line)
        if a:
            last = a.group(1)
            current[last] = a.group(2)
    return out


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(str(text).strip())
    except ValueError:
        return None


def status_from_attrs(job_id: str, attrs: dict[str, str]) -> JobStatus:
    """One job's attributes -> :class:`JobStatus` in Slurm's vocabulary.

    A finished job's state comes from its exit status: 0 is COMPLETED, PBS
    Pro's walltime kill (-29) is TIMEOUT, 256+signal is a kill (qdel sends
    SIGTERM then SIGKILL: CANCELLED), anything else FAILED.
    """
    letter = (attrs.get("job_state") or "").strip()[:1]
    state = PBS_STATES.get(letter, "UNKNOWN")
    code = _int(attrs.get("Exit_status", attrs.get("exit_status")))
    exit_code = code
    if state == "COMPLETED" and code is not None:
        if code in _WALLTIME_EXITS:
            state = "TIMEOUT"
        elif code > _SIGNAL_BASE:
            sig = code - _SIGNAL_BASE
            state = "CANCELLED" if sig in (9, 15) else "FAILED"
            exit_code = 128 + sig
        elif code != 0:
            state = "FAILED"
    reason = attrs.get("comment", "")
    if letter == "H":
        reason = f"held ({attrs.get('Hold_Types', '?')}) {reason}".strip()
    hosts = attrs.get("exec_host", "")
    nodes = ",".join(dict.fromkeys(h.split("/")[0] for h in hosts.split("+") if h))
    restarts = _int(attrs.get("run_count"))
    return JobStatus(
        job_id=job_id,
        state=state,
        exit_code=exit_code,
        reason=reason,
        elapsed=attrs.get("resources_used.walltime", ""),
        name=attrs.get("Job_Name", ""),
        nodes=nodes,
        restarts=max(0, (restarts or 1) - 1),
        raw=attrs,
    )


def find_job(jobs: dict[str, dict[str, str]], job_id: str) -> tuple[str, dict[str, str]] | None:
    """``1234`` matches ``1234.server``: users and qsub print the short or the full id."""
    if job_id in jobs:
        return job_id, jobs[job_id]
    short = job_id.split(".")[0]
    return next(((jid, attrs) for jid, attrs in jobs.items() if jid.split(".")[0] == short), None)
