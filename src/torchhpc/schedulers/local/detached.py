"""A local job run detached from its client (``run --background``), by ``python -m torchhpc.supervisor.background DIR``.

Its own module, beside :mod:`~torchhpc.schedulers.local.jobs` (which starts the process and
reads its record); the scheduler that runs the ranks is handed in
(:meth:`~torchhpc.schedulers.local.local.LocalScheduler.run_background`), and so is the wrapper
that restarts and watches the attempts (:mod:`torchhpc.supervisor.restarts`, a layer above
the schedulers: it reads the verdict and the hang watch).
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from torchhpc.errors import JobFailed
from torchhpc.jobdir.endmark import write_end
from torchhpc.jobdir.shm import SHM_ENV, release
from torchhpc.schedulers.api import Submission
from torchhpc.schedulers.local.allocation import run_id_of
from torchhpc.schedulers.local.jobs import SUBMISSION, update_state

if TYPE_CHECKING:
    from torchhpc.schedulers.dependencies import DependencyState

__all__ = ["run_detached"]


class Attempts(Protocol):
    """What :class:`torchhpc.supervisor.restarts.Restarts` offers: run the attempts; did the watch fire."""

    fired: bool
    at_exit: str  # every rank's program had ended; the watch stopped what hung at exit (its lines)

    def run(self, attempt: Callable[[int], int]) -> int: ...

    def exit_code(self, fallback: int) -> int: ...

    def extra_args(self, count: int) -> list[str]: ...


def run_detached(d: Path, scheduler: Any, attempts: Callable[[Path, Submission], Attempts]) -> int:
    """Run the submission in ``d`` on ``scheduler``, as many attempts as
    ``attempts(d, submission)`` allows, and record how it ended."""
    def cancelled_early(signum: int, frame: object) -> None:
        raise JobFailed(f"interrupted by {signal.Signals(signum).name} before the ranks started", returncode=128 + signum)

    # Until the runner installs its own handlers (and after it restores this one).
    signal.signal(signal.SIGTERM, cancelled_early)
    with open(d / SUBMISSION, "rb") as f:
        submission: Submission = pickle.load(f)
    rec = update_state(d, pid=os.getpid())
    os.chdir(str(rec.get("cwd") or "."))
    state, code, reason = "COMPLETED", 0, ""
    try:
        if submission.spec.after:
            never = _wait(d, submission, scheduler)
            if never:
                # Slurm's words (the status line's reason); which dependency failed: status's dependency lines.
                # Exit 1, as the foreground run records it: the job has no code of its own, and wait says 1
                update_state(d, state="CANCELLED", exit_code=1, reason="DependencyNeverSatisfied", ended=time.time())
                print(f"torchhpc: {never}", file=sys.stderr, flush=True)
                return 1
    except JobFailed as e:  # cancelled while it waited
        update_state(d, state="CANCELLED", exit_code=e.exit_code, reason=e.message, ended=time.time())
        return e.exit_code
    update_state(d, state="RUNNING", reason="", started=time.time())
    def attempt(count: int) -> int:
        this = submission
        extra = tries.extra_args(count)  # --on-restart-append (supervisor/resume.py)
        if extra:
            print(f"torchhpc: attempt {count} adds to the program: {' '.join(extra)}", file=sys.stderr, flush=True)
            this = dataclasses.replace(submission, argv=(*submission.argv, *extra))
        return int(scheduler.run(this, run_id=run_id_of(d.name), stdout=sys.stdout, stderr=sys.stdout,
                                 dependencies=False, restart_count=count, job_dir=str(d)))

    tries = attempts(d, submission)
    try:
        tries.run(attempt)
        reason = f"completed; hung at exit: {tries.at_exit}" if tries.at_exit else reason
    except JobFailed as e:
        state = "CANCELLED" if e.message.startswith("interrupted") else "FAILED"
        code, reason = e.exit_code, e.message
        if tries.fired:
            reason = f"the hang watch cancelled the run (--hang-timeout {submission.spec.hang_timeout:g})"
        if tries.fired or (state == "FAILED" and submission.spec.max_restarts):
            code = tries.exit_code(code)  # the class's code (core/exitcodes.py), as the Slurm supervisor's
        print(f"torchhpc: {reason}", file=sys.stderr, flush=True)
    except Exception as e:  # recorded, never left as RUNNING
        state, code, reason = "FAILED", 1, f"{type(e).__name__}: {e}"
        print(f"torchhpc: {reason}", file=sys.stderr, flush=True)
    release(run_id_of(d.name), submission.spec.env_dict.get(SHM_ENV))  # before the end is said: a waiter may resume
    ended = time.time()
    update_state(d, state=state, exit_code=code, reason=reason, ended=ended)
    write_end(str(d), state, code, ended)  # after the record: a waiter that sees the marker reads the final record
    return code


def _wait(d: Path, submission: Submission, scheduler: Any) -> str:
    """PENDING, its reason naming what it waits for, until the dependencies are met: "" then, else
    the reason it can never start (``DependencyNeverSatisfied: ...``, Slurm's word)."""
    from torchhpc.schedulers.dependencies import wait_dependencies

    def waiting(states: list[DependencyState]) -> None:
        update_state(d, state="PENDING", reason="Dependency")  # Slurm's word; status lists what it waits for

    never = wait_dependencies(scheduler, submission.spec.after, progress=waiting)
    return "DependencyNeverSatisfied: " + "; ".join(s.line() for s in never) if never else ""

