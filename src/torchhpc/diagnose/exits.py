"""Done is done: the moment each rank's program returned, and a job whose ranks then hang at exit.

The rank boot (boot/sitecustomize.py) writes ``<job dir>/ended/rank-N`` when the rank's program has
returned: its main script ended, ``sys.exit`` was called, or an exception ended it (it says which).
A program that did all its work can still stop in its exit: a blocked ``destroy_process_group``
(a known NCCL trap), a thread the interpreter joins, an ``atexit`` handler. Under load such an
exit stayed quiet for 15 s and the hang watch ended a run whose program had finished as FAILED.

With every rank's mark in place and clean, the hang watch (diagnose/hang.py) no longer fails the
job: after an exit grace (the hang timeout itself, counted from the last rank's return) it stops
what is left and the job is COMPLETED, with a line per rank that hung at exit and where
("rank 1 stopped 15 s after its program ended: destroy_process_group"). A hang before every rank
returned stays a hang.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from torchhpc.jobdir.layout import ENDED_DIR, read_json

if TYPE_CHECKING:
    from torchhpc.diagnose.probe import RankStack

__all__ = ["ENDED_DIR", "Ended", "all_returned", "clear", "grace_left", "hung_at_exit", "in_teardown", "read"]



@dataclass(frozen=True)
class Ended:
    """One rank's mark: when its program returned, how, and the world it belonged to."""

    rank: int
    world: int
    time: float
    how: str  # "returned", "exit N" (sys.exit), "raised TYPE" (an uncaught exception)

    @property
    def clean(self) -> bool:
        return self.how in ("returned", "exit 0", "exit None")


def read(job_dir: str, since: float = 0.0) -> dict[int, Ended]:
    """rank -> its mark, for the marks written at or after ``since``."""
    d = os.path.join(job_dir, ENDED_DIR)
    out: dict[int, Ended] = {}
    for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
        if not name.startswith("rank-") or not name[5:].isdigit():
            continue
        try:
            m = read_json(os.path.join(d, name))
            e = Ended(int(m["rank"]), int(m["world"]), float(m["time"]), str(m["how"]))
        except (ValueError, KeyError, TypeError):  # unreadable (None) or not a mark
            continue
        if e.time >= since:
            out[e.rank] = e
    return out


def in_teardown(job_dir: str, since: float = 0.0) -> set[int]:
    """The ranks that began destroying their default group (``rank-N.teardown``) at or after ``since``."""
    d = os.path.join(job_dir, ENDED_DIR)
    out = set()
    for name in os.listdir(d) if os.path.isdir(d) else []:
        rank = name[5:].partition(".")[0]
        if name.startswith("rank-") and name.endswith(".teardown") and rank.isdigit():
            try:
                if os.stat(os.path.join(d, name)).st_mtime >= since:
                    out.add(int(rank))
            except OSError:
                continue
    return out


def clear(job_dir: str) -> None:
    """Forget the marks of an attempt before the next one starts (its ranks are gone)."""
    shutil.rmtree(os.path.join(job_dir, ENDED_DIR), ignore_errors=True)


def all_returned(marks: Mapping[int, Ended]) -> bool:
    """Every rank of the world has returned from its program, cleanly."""
    if not marks:
        return False
    world = max(e.world for e in marks.values())
    return sorted(marks) == list(range(world)) and all(e.clean for e in marks.values())


# The frames a rank's exit stops in, innermost first; the first one found says where it hung
_WHERE = ("destroy_process_group", "_shutdown", "join", "_left_group", "gloo_workers_settle", "flight_dump")


def hung_at_exit(marks: Mapping[int, Ended], stacks: Sequence[RankStack], now: float) -> list[str]:
    """One line per rank still alive after its program ended: for how long, and where it stopped
    (the teardown call its stack is in, else its innermost frame; the reason when no stack was read)."""
    lines = []
    for s in sorted(stacks, key=lambda s: s.rank):
        e = marks.get(s.rank)
        if e is None:
            continue
        if s.frames:
            fn, path, line = next((f for f in s.frames if f[0] in _WHERE), s.frames[0])
            where = f"{fn} ({os.path.basename(path)}:{line})"
        else:
            where = f"stack not read ({s.error or 'no reason given'})"
        lines.append(f"rank {s.rank} stopped {max(0.0, now - e.time):.0f} s after its program ended: {where}")
    return lines


def grace_left(marks: Mapping[int, Ended], grace: float, now: float) -> Optional[float]:
    """Seconds of exit grace left after the last rank returned (None: not every rank has)."""
    if not all_returned(marks):
        return None
    return max(0.0, grace - (now - max(e.time for e in marks.values())))
