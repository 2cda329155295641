"""A job's own clock, as its scheduler keeps it: submit, eligible, start and end (epoch seconds).

``torchhpc events`` lays the supervisor's attempts over these times, so the account it prints
matches the scheduler's accounting to the second. Each backend answers :meth:`Scheduler.times`
from what it already asks for ``status`` (Slurm: one ``sacct``; PBS: ``qstat -f``; local: the
job's record), never more.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

__all__ = ["JobTimes", "clock"]


@dataclass(frozen=True)
class JobTimes:
    """``None``: the scheduler does not know (yet): a pending job has no start, a running one no end."""

    submit: Optional[float] = None
    eligible: Optional[float] = None
    start: Optional[float] = None
    end: Optional[float] = None
    state: str = ""
    exit_code: Optional[int] = None
    nodes: str = ""
    # (when seen, why): the pending reasons the scheduler still shows (Slurm's Reason, PBS's comment)
    reasons: tuple[tuple[float, str], ...] = ()
    source: str = ""  # "sacct", "scontrol", "qstat", "record": where the times came from
    # a requeued job's earlier runs, as the scheduler kept them: (start, end, nodes) each (Slurm: sacct -D)
    runs: tuple[tuple[float, float, str], ...] = ()
    raw: dict[str, str] = field(default_factory=dict)


_FORMATS = ("%Y-%m-%dT%H:%M:%S", "%a %b %d %H:%M:%S %Y", "%Y-%m-%d %H:%M:%S")


def clock(text: object) -> Optional[float]:
    """A scheduler's timestamp in local time (``2026-11-22T04:10:02``, PBS's ``Sat Nov 22 04:10:02
    2026``) or epoch seconds -> epoch seconds; ``None`` for ``Unknown``, ``None``, empty or unreadable."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return float(text) if text > 0 else None
    value = str(text or "").strip()
    if not value or value in ("Unknown", "None", "N/A", "0"):
        return None
    if value.isdigit():
        return float(value)
    for fmt in _FORMATS:
        try:
            return time.mktime(time.strptime(value, fmt))
        except ValueError:
            continue
    return None
