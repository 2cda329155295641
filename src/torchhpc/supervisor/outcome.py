"""How an attempt of the supervised job ended (supervisor/loop.py): an :class:`Outcome`, its class read from what
each rank wrote during the attempt (the earliest rank with a cause), and whether a rank of the attempt has written
anything yet (its first line: the hang watch allows a slow start more quiet before it)."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import Optional

__all__ = ["Outcome", "classify_attempt", "log_sizes", "wrote"]


@dataclass
class Outcome:
    klass: Optional[str]
    rc: int
    dead: list[str] = field(default_factory=list)
    rank: Optional[int] = None
    detail: str = ""
    # A node died, or the supervisor ended a hung step while no stop had been asked for: a stop file
    # that exists now was made by the ranks' SIGTERM handler as their node or step went down (seen:
    # the ranks of the dying node itself, before its link was gone), not by a warning. A time-limit
    # warning at the very moment a node dies is lost with it: the restarted or requeued job runs on.
    teardown: bool = False
    found_by: str = "step-end"  # attempts.json's found_by: probe, hang-watch, or the step ended by itself
    fault: Optional[float] = None  # when the supervisor saw the failure (attempts.json's parts of a recovery)
    teardown_s: Optional[float] = None
    first_line: Optional[float] = None



def log_sizes(ranks_dir: str) -> dict[str, int]:
    from torchhpc.jobdir.logs import rank_files

    out = {}
    for _rank, (path, _node) in rank_files(ranks_dir).items():
        with contextlib.suppress(OSError):
            out[path] = os.path.getsize(path)
    return out


def wrote(ranks_dir: str, sizes: dict[str, int]) -> bool:
    """Whether a rank of this attempt has written a byte (its log grew past ``sizes``)."""
    return any(n > sizes.get(path, 0) for path, n in log_sizes(ranks_dir).items())


def classify_attempt(ranks_dir: str, sizes: dict[str, int], rc: int) -> Outcome:
    """The attempt's class from what each rank wrote during it: the earliest rank with a cause."""
    from torchhpc.diagnose.classify import first_cause
    from torchhpc.jobdir.logs import rank_files

    written: list[tuple[float, int, list[str]]] = []
    for rank, (path, _node) in rank_files(ranks_dir).items():
        try:
            with open(path, errors="replace") as f:
                f.seek(sizes.get(path, 0))
                lines = f.read().splitlines()
            mtime = os.path.getmtime(path)
        except OSError:
            continue
        written.append((mtime, rank, lines))
    klass, first, error = first_cause((r, lines) for _t, r, lines in sorted(written))
    return Outcome(klass, rc, rank=first, detail=error)
