"""``--on-restart-append 'ARGS'``: what a restarted attempt adds to the program's arguments.

Some scripts resume only when told, e.g. accelerate's ``--resume_from_checkpoint DIR``. On every
attempt after the first, the supervisors (the Slurm one and the local one) add ARGS to the
program's command line; ``{latest:GLOB}`` in them becomes the newest match of GLOB (by modification
time, relative to the job's working directory) when the attempt starts:

    torchhpc run ... --max-restarts 3 --on-restart-append '--resume_from_checkpoint {latest:out/checkpoint-*}' train.py

Where a ``{latest:GLOB}`` matches nothing (no checkpoint saved yet), nothing is added: the attempt
starts from scratch, as the first did, and the supervisor says so.
"""

from __future__ import annotations

import glob
import os
import re
import shlex
from collections.abc import Callable

__all__ = ["restart_args"]

_LATEST = re.compile(r"\{latest:([^}]+)\}")


def restart_args(template: str, count: int, cwd: str = ".", say: Callable[[str], None] = lambda _t: None) -> list[str]:
    """The arguments attempt ``count`` (0-based) adds to the program: none on the first attempt."""
    if not template or count == 0:
        return []
    words = shlex.split(template)  # checked when the spec was made (core/spec.py)
    missing: list[str] = []

    def newest(m: re.Match[str]) -> str:
        pattern = m.group(1)
        found = glob.glob(pattern if os.path.isabs(pattern) else os.path.join(cwd, pattern))
        if not found:
            missing.append(pattern)
            return ""
        best = max(found, key=lambda p: (os.path.getmtime(p), p))
        return best if os.path.isabs(pattern) else os.path.relpath(best, cwd)

    out = [_LATEST.sub(newest, w) for w in words]
    if missing:
        say(f"--on-restart-append: nothing matches {', '.join(missing)} yet: attempt {count} adds no arguments")
        return []
    return out
