"""The no-progress stop: restarts that never advance the checkpoint end the job (``no-progress``).

A hang or a network error is restarted because its cause is outside the program, as a rule. When
the restarted attempts fail again and again before the program saves anything new, the restarts
burn the allocation (a "restart storm", NVRx's word): after ``--max-no-progress K`` attempts in a
row without a newer checkpoint (3 by default, 0: never stop for this), the job ends with the class
``no-progress`` and says so: "restart storm: hang x3 at step 1200, no checkpoint advance".

Where the newest checkpoint is read from, first found first:

* ``<job dir>/checkpoint.json``, written by torchhpc's helper (:func:`torchhpc.dist.checkpoint.save`)
  when the job's directory is known to the ranks (``TORCHHPC_JOB_DIR`` or ``TORCHHPC_RANKS_DIR``);
* the newest file or directory under ``--checkpoint-dir DIR`` (two levels deep): its step is the
  last number in its name (``ckpt-000001200``, ``ckpt-000001200.pt``, ``checkpoint-1200``, ``epoch=3-step=1200.ckpt``),
  and a name without one counts by its modification time.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

from torchhpc.jobdir.layout import CHECKPOINT, read_json

__all__ = ["Checkpoint", "NoProgress", "newest_checkpoint"]

_DIGITS = re.compile(r"(\d+)")


@dataclass(frozen=True, order=True)
class Checkpoint:
    """The newest checkpoint seen: ordered by step (where known), then by time."""

    step: int  # -1 where the name holds no number
    mtime: float
    path: str = field(compare=False, default="")


def _step(name: str) -> int:
    found = _DIGITS.findall(name)
    return int(found[-1]) if found else -1


def newest_checkpoint(job_dir: str, checkpoint_dir: Optional[str] = None) -> Optional[Checkpoint]:
    """The newest checkpoint of the job, or None when none is seen (see the module's docstring)."""
    with contextlib.suppress(ValueError, KeyError, TypeError):  # unreadable (None) or not the helper's marker
        d = read_json(os.path.join(job_dir, CHECKPOINT))
        return Checkpoint(int(d["step"]), float(d.get("time", 0.0)), str(d.get("path", "")))
    if not checkpoint_dir:
        return None
    best: Optional[Checkpoint] = None
    for entry in _entries(checkpoint_dir, depth=2):
        try:
            c = Checkpoint(_step(os.path.basename(entry)), os.stat(entry).st_mtime, entry)
        except OSError:
            continue
        best = c if best is None or c > best else best
    return best


def _entries(top: str, depth: int) -> list[str]:
    out: list[str] = []
    with contextlib.suppress(OSError), os.scandir(top) as it:
        for e in it:
            if e.name.startswith(".") or e.name.endswith(".tmp"):
                continue  # a save in progress (the helper writes .tmp, then renames)
            out.append(e.path)
            if depth > 1 and e.is_dir(follow_symlinks=False):
                out += _entries(e.path, depth - 1)
    return out


class NoProgress:
    """Counts the attempts in a row that ended without a newer checkpoint than they began with."""

    def __init__(self, limit: int, job_dir: str, checkpoint_dir: Optional[str] = None) -> None:
        self.limit, self.job_dir, self.checkpoint_dir = limit, job_dir, checkpoint_dir
        self.best = newest_checkpoint(job_dir, checkpoint_dir)  # what the job starts from
        self.storm: list[str] = []  # the classes of the attempts in a row without an advance

    def after(self, klass: Optional[str]) -> Optional[int]:
        """Note the end of an attempt (its class); the newest checkpoint step (None: none seen)."""
        now = newest_checkpoint(self.job_dir, self.checkpoint_dir)
        if now is not None and (self.best is None or now > self.best):
            self.best, self.storm = now, []
        else:
            self.storm.append(klass or "none")
        return None if self.best is None or self.best.step < 0 else self.best.step

    def why_stop(self) -> str:
        """'' while the restarts may go on, else the verdict's words: 'restart storm: hang x3 at ...'."""
        if not self.limit or len(self.storm) < self.limit:
            return ""
        counts = Counter(self.storm[-self.limit:])
        what = ", ".join(f"{k} x{n}" for k, n in counts.most_common())
        if self.best is None:
            where = "before the first checkpoint"
        elif self.best.step >= 0:
            where = f"at step {self.best.step}"
        else:
            where = f"at {os.path.basename(self.best.path)}"
        return (f"restart storm: {what} {where}, no checkpoint advance; "
                f"the job ends (no-progress; --max-no-progress 0 turns this stop off)")
