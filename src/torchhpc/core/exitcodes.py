"""The exit code a supervised job ends with, one per verdict class (docs/resilience.md).

A site's requeue logic (Slurm's ``RequeueExit=``, a wrapper script, a Kubernetes
``podFailurePolicy`` rule) can act on the class from the exit status alone, without parsing logs.

Why 80-95: the codes must not be mistaken for another convention's. 0-2 are success, a generic
error and a usage error; 64-78 are sysexits.h (``EX_USAGE`` ...); 126-127 are the shell's "not
executable" and "not found"; 128+N is death by signal N (137 SIGKILL, 143 SIGTERM); systemd
reserves 200-243 and ssh returns 255. 80-95 is free of all of them, and one block of 16 holds
every class: the infrastructure classes (restarted by the supervisor) first, then the ends that
a stop protocol handles, then the program's own faults.

Stdlib only, in ``core``: the supervisor, the CLI and every scheduler backend (the Kubernetes
failure policy is rendered from it) read the same table.
"""

from __future__ import annotations

from typing import Optional

__all__ = ["EXIT_CODES", "INFRASTRUCTURE", "RESTARTABLE", "class_of_exit", "exit_code_for", "help_table"]

# class -> exit code; docs/resilience.md shows this table (a unit test keeps them equal)
EXIT_CODES: dict[str, int] = {
    # the infrastructure: a restart (or a requeue without the node) can help
    "node-failure": 80,
    "hang": 81,
    "network": 82,
    "lost-peer": 83,
    # restarts that never advanced the checkpoint: stop, a person looks
    "no-progress": 84,
    # ended from outside: the stop protocol (--signal-before, --requeue) handles them
    "time-limit": 85,
    "preempted": 86,
    "cancelled": 87,
    # the program's own: the same code fails the same way
    "user-exception": 88,
    "cuda-oom": 89,
    "host-oom": 90,
    "gpu-assignment": 91,
    "environment": 92,
    "native-crash": 93,
    "collective-mismatch": 94,
    "unknown": 95,
}
INFRASTRUCTURE = frozenset(("node-failure", "hang", "network", "lost-peer"))

_BY_CODE = {v: k for k, v in EXIT_CODES.items()}


def help_table() -> str:
    """The exit codes of ``run``, ``wait`` and ``status`` as ``--help`` and the README show them: one
    table, one home. What a command exits with is what the job's record holds, wherever it is read back
    (status, wait, events, diagnose --json)."""
    import textwrap  # here: the table is wrapped for --help only

    classes = " ".join(f"{code}\x00{klass}" for klass, code in EXIT_CODES.items())  # \x00: never split a pair
    body = textwrap.fill(classes, width=96, initial_indent=" " * 11, subsequent_indent=" " * 11,
                         break_on_hyphens=False).replace("\x00", " ")
    return (
        "exit codes (the shell's, and the job record's: status, wait, events, diagnose --json):\n"
        "  0        done (wait: the job completed)\n"
        "  1        the job failed with no code of its own, or a command (sbatch, kubectl...) failed\n"
        "  2        bad input: a flag, a handle, a profile or config value (Error: + HINT:)\n"
        "  N        the job's own exit code: a local run, run --wait, wait\n"
        "  80-95    supervised (--max-restarts, --spares): the failure's class; a hang --hang-timeout named: 81\n"
        "           (docs/resilience.md)\n"
        f"{body}\n"
        "  124      wait --timeout ran out; the job goes on\n"
        "  128+N    killed by signal N: 130 Ctrl-C, 137 SIGKILL, 143 SIGTERM (a cancel, running or pending)\n"
    )


def exit_code_for(klass: Optional[str]) -> int:
    """The exit code of a job that ended with ``klass`` (0 for a success, None; ``unknown``'s for a
    class this table does not name: never 1, which says nothing)."""
    if klass is None:
        return 0
    return EXIT_CODES.get(klass, EXIT_CODES["unknown"])


def class_of_exit(code: Optional[int]) -> Optional[str]:
    """The class an exit code stands for, or None when it is not one of :data:`EXIT_CODES`."""
    return _BY_CODE.get(code) if code is not None else None

# Which classes restart is the supervisor's policy (supervisor/policy.py: RESTART_CLASSES); this repeats it
# for the rooms below the supervisor (the Kubernetes failure policy), and a unit test keeps the two equal.
RESTARTABLE = INFRASTRUCTURE
