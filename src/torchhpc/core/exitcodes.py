"""The exit code a job ends with, by the verdict's class: a site's requeue logic (or a JobSet's
failure policy) acts on the class without parsing logs.

Codes 64-79: clear of 0-2 (success, the usual errors, usage), 126-128 (the shell's "cannot
execute", "not found", bad exit) and 128+N (killed by signal N), which a launcher reports for
its ranks. The table is pure data and sits in ``core`` so that every room can read it: the
Kubernetes render (``schedulers/``) as much as the verdict (``diagnose/classify.py``, which
re-exports it) and the supervisor. Which classes restart is the supervisor's policy
(``supervisor/policy.py``: ``RESTART_CLASSES``); :data:`RESTARTABLE` repeats it for the rooms
below the supervisor, and a unit test keeps the two equal.
"""

from __future__ import annotations

__all__ = ["EXIT_CODES", "RESTARTABLE", "class_of_exit"]

EXIT_CODES: dict[str, int] = {
    # infrastructure: outside the program; a restart (without the bad node) can help
    "node-failure": 64,
    "hang": 65,
    "network": 66,
    "lost-peer": 67,
    # the scheduler's own ends
    "time-limit": 68,
    "preempted": 69,
    # the program's: the same code fails the same way again
    "user-exception": 70,
    "native-crash": 71,
    "cuda-oom": 72,
    "host-oom": 73,
    "environment": 74,
    "gpu-assignment": 75,
    "collective-mismatch": 76,
    "no-progress": 77,  # restarts that never advanced the checkpoint (a restart storm)
    "cancelled": 78,
    "unknown": 79,
}

RESTARTABLE = frozenset({"node-failure", "hang", "network", "lost-peer"})


def class_of_exit(code: int) -> str:
    """The class a job's exit code names (``""``: not one of ours, e.g. 1 or 137)."""
    for klass, value in EXIT_CODES.items():
        if value == code:
            return klass
    return ""
