"""Every file of a job directory, named once, and how a process finds its job directory.

A job directory (``<output dir>/<name>-<id>/`` for batch jobs, the local job store's ``<id>/``) holds
what the job's processes write and every command that reads a job back reads: submitit's ``JobPaths``
names each file of its job folder as one property for the same reason. The stdlib-only rank boot
(``boot/sitecustomize.py``) keeps its own literals, held equal by tests/unit/test_one_home.py.

A process finds its job directory from ``$TORCHHPC_JOB_DIR`` (the local scheduler sets it), else the
parent of ``$TORCHHPC_RANKS_DIR`` (batch scripts export it), else of ``$TORCHHPC_FR_DIR``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

__all__ = [
    "ATTEMPTS",
    "CHECKPOINT",
    "END",
    "ENDED_DIR",
    "FR_DIR",
    "FR_VAR",
    "HANG",
    "JOB_DIR_VAR",
    "RANKS_DIR",
    "RANKS_VAR",
    "RECORD",
    "job_dir_of",
    "read_json",
]

END = "end.json"  # the end marker: state, exit code, time (jobdir/endmark.py)
ATTEMPTS = "attempts.json"  # the supervisor's attempts (jobdir/attempts.py)
CHECKPOINT = "checkpoint.json"  # the checkpoint helper's saves and resumes (dist/checkpoint.py)
HANG = "hang.json"  # the hang watch's diagnosis (diagnose/hang.py)
RECORD = "record.json"  # a local job's record (schedulers/local/jobs.py)
FR_DIR = "fr"  # the ranks' Flight Recorder dumps
RANKS_DIR = "ranks"  # one log per rank
ENDED_DIR = "ended"  # the marks of each rank's return (the rank boot writes them)

JOB_DIR_VAR = "TORCHHPC_JOB_DIR"
RANKS_VAR = "TORCHHPC_RANKS_DIR"
FR_VAR = "TORCHHPC_FR_DIR"


def job_dir_of(environ: Mapping[str, str] = os.environ) -> str:
    """This process's job directory, as its scheduler told it ("" when it did not)."""
    ranks = environ.get(RANKS_VAR, "").rstrip("/")
    fr = environ.get(FR_VAR, "").rstrip("/")
    return environ.get(JOB_DIR_VAR) or (os.path.dirname(ranks) if ranks else os.path.dirname(fr) if fr else "")


def read_json(path: str | os.PathLike[str]) -> Any:
    """The JSON in the file at ``path``, of any shape; None when it is missing, unreadable or not JSON."""
    import json

    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
