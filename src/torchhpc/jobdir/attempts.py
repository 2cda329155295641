"""``<job dir>/attempts.json`` on disk: read and written whole (supervisor/attempts.py says what an
attempt holds). Here, below both, so that the supervisor that writes it and ``diagnose``'s timeline
that reads it share one reader."""

from __future__ import annotations

import json
import os
from typing import Any

from torchhpc.jobdir.layout import ATTEMPTS, read_json

__all__ = ["load_attempts", "save_attempts", "shrunk"]


def load_attempts(job_dir: str) -> list[dict[str, Any]]:
    """The attempts recorded in ``job_dir`` (``[]`` when none or unreadable)."""
    data = read_json(os.path.join(job_dir, ATTEMPTS))
    return [d for d in data if isinstance(d, dict)] if isinstance(data, list) else []


def save_attempts(job_dir: str, attempts: list[dict[str, Any]]) -> None:
    """Write the list whole, through a temporary file: a reader never sees half of it."""
    path = os.path.join(job_dir, ATTEMPTS)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(attempts, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def shrunk(attempt: dict[str, Any], full: int) -> str:
    """`` world 4 of 6 (2 ranks, 33 % of the capacity, lost)`` for an attempt on fewer nodes (``--min-nodes``)."""
    world = int(attempt.get("world_size") or 0)
    if not world or world >= full:
        return f" world {world}" if world else ""
    lost = full - world
    share = f"{100 * lost / full:.0f} %"
    return f" world {world} of {full} ({lost} {'rank' if lost == 1 else 'ranks'}, {share} of the capacity, lost)"
