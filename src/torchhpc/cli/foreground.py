"""A local run in the foreground (``torchhpc run -n 4 train.py``) with the same watch and verdict as any job.

The ranks' output goes to the terminal as it always did, and also to a job directory like a
background job's (``output.log`` beside a record), so that the same code serves both:

* ``--hang-timeout S`` starts the hang watch in a thread of this process: after S quiet seconds
  it reads every rank's stack, names the culprit, saves ``hang.json`` and cancels the run, as
  ``torchhpc wait --hang-timeout`` does for a background or cluster job;
* ``--max-restarts N`` starts the run again after a hang, a network error or a lost peer
  (supervisor/restarts.py: the in-allocation supervisor's policy);
* a failed run ends with the verdict (``diagnosis: ...``) read from that directory, not only
  with the rank's exit code;
* ``torchhpc logs|status|diagnose|cancel local:ID`` work on the run while it runs and after.

A job array keeps the plain foreground run (its tasks are separate runs, each labelled).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any, Optional

from torchhpc.cli.common import eprint
from torchhpc.cli.follow import check_on_hang, hang_watch, print_verdict
from torchhpc.core.exitcodes import exit_code_for
from torchhpc.errors import JobFailed, UsageError
from torchhpc.schedulers.api import Submission
from torchhpc.supervisor.restarts import Restarts
from torchhpc.supervisor.resume import restart_args

__all__ = ["run_foreground"]


def run_foreground(scheduler: Any, submission: Submission, *, rank0_only: bool = False,
                   hang_timeout: Optional[float] = None, on_hang: str = "cancel") -> int:
    """Run ``submission`` here, in the foreground; its exit code (the failure's verdict printed on stderr)."""
    if submission.spec.array is not None:
        if hang_timeout:
            raise UsageError(
                "--hang-timeout: the tasks of a local job array are separate runs; the watch follows one run",
                "drop --hang-timeout, or run each task on its own (--env TORCHHPC_ARRAY_INDEX=I)",
            )
        return _run_array(scheduler, submission, rank0_only)
    if hang_timeout:
        check_on_hang(scheduler, on_hang)
    jobs = scheduler  # the local scheduler keeps the run's record (schedulers/local/jobs.py)
    job_id, log_path = jobs.start_here(submission)
    _record_early_signals()
    watch = None
    if hang_timeout:
        def watch(act: Callable[[str], None]) -> Any:
            return hang_watch(scheduler, job_id, hang_timeout, on_hang, act=act)
    spec = submission.spec
    tries = Restarts(max_restarts=spec.max_restarts, job_dir=os.path.dirname(log_path), log_path=log_path,
                     watch=watch, max_no_progress=spec.max_no_progress, checkpoint_dir=spec.checkpoint_dir)

    def attempt(count: int) -> int:
        extra = restart_args(spec.on_restart_append, count, say=lambda text: eprint(f"torchhpc: {text}"))
        if extra:
            eprint(f"torchhpc: attempt {count} adds to the program: {' '.join(extra)}")
        this = dataclasses.replace(submission, argv=(*submission.argv, *extra)) if extra else submission
        with open(log_path, "a", encoding="utf-8", errors="backslashreplace") as log:
            return int(scheduler.run(this, rank0_only=rank0_only, run_id=scheduler.run_id_of(job_id), log=log,
                                     restart_count=count, job_dir=os.path.dirname(log_path)))

    state, code, reason, hint = "COMPLETED", 0, "", ""
    try:
        tries.run(attempt)
        reason = f"completed; hung at exit: {tries.at_exit}" if tries.at_exit else ""
    except JobFailed as e:
        # a job that never started (its dependency failed) is CANCELLED, as Slurm ends it, with 1: no code of its own
        state = "CANCELLED" if e.message.startswith(("interrupted", "DependencyNeverSatisfied")) else "FAILED"
        code, reason, hint = e.exit_code, e.message, e.hint or ""
        if tries.fired:  # our own SIGTERM: say who sent it
            reason = f"the hang watch cancelled the run (--hang-timeout {hang_timeout:g})" + "".join(reason.partition(";")[1:])
    except KeyboardInterrupt:  # Ctrl-C before the ranks ran (waiting on --after-ok): main() exits 130
        jobs.end_here(job_id, "CANCELLED", 130, "interrupted by SIGINT (Ctrl-C) before the ranks started", ran=False)
        raise
    except BaseException as e:  # recorded, never left RUNNING; the caller reports it
        jobs.end_here(job_id, "FAILED", 1, f"{type(e).__name__}: {e}")
        raise
    from torchhpc.jobdir.shm import SHM_ENV, release

    release(scheduler.run_id_of(job_id), spec.env_dict.get(SHM_ENV))  # its memory tier (dist/memtier.py) to disk, then freed
    jobs.end_here(job_id, state, code, reason, ran=not _never_ran(reason))
    final = _final_code(scheduler, job_id, state, code, reason, hint, tries, spec, hang_timeout)
    if final != code:  # one truth: the record says what the shell sees (status, events, diagnose --json)
        jobs.end_here(job_id, state, final, reason, ran=not _never_ran(reason))
    return final


def _never_ran(reason: str) -> bool:
    """Whether the run ended before any rank started: its dependency failed, or a signal came while it waited."""
    return reason.startswith("DependencyNeverSatisfied") or reason.endswith("before the ranks started")


class _Tee:
    """The terminal, and the run's ``output.log``: what a foreground array prints is its record's log too."""

    def __init__(self, out: Any, log: Any) -> None:
        self.out, self.log = out, log

    def write(self, text: str) -> int:
        self.log.write(text)
        return int(self.out.write(text))

    def flush(self) -> None:
        self.log.flush()
        self.out.flush()


def _run_array(scheduler: Any, submission: Submission, rank0_only: bool) -> int:
    """A local array in the foreground, with a record and an ``output.log`` like a background array's, so
    ``list --last``, ``status``, ``logs`` and ``diagnose`` read it back (each task's lines behind [task I])."""
    import sys

    from torchhpc.jobdir.shm import SHM_ENV, release

    job_id, log_path = scheduler.start_here(submission)
    state, code, reason = "COMPLETED", 0, ""
    try:
        with open(log_path, "a", encoding="utf-8", errors="backslashreplace") as log:
            try:
                code = int(scheduler.run(submission, rank0_only=rank0_only, stdout=_Tee(sys.stdout, log),
                                         stderr=_Tee(sys.stderr, log)))
            except JobFailed as e:
                state = "CANCELLED" if e.message.startswith("interrupted") else "FAILED"
                code, reason = e.exit_code, e.message
                log.write(f"torchhpc: {reason}\n")  # as the background array's log ends
                raise
    except BaseException as e:
        if state == "COMPLETED":  # not the array's own failure: Ctrl-C, an error of ours
            state, code, reason = "CANCELLED" if isinstance(e, KeyboardInterrupt) else "FAILED", 130 if \
                isinstance(e, KeyboardInterrupt) else 1, f"{type(e).__name__}: {e}"
        raise
    finally:
        release(scheduler.run_id_of(job_id), submission.spec.env_dict.get(SHM_ENV))
        scheduler.end_here(job_id, state, code, reason)
    return code


def _record_early_signals() -> None:
    """SIGTERM (``torchhpc cancel``, ``timeout``) or SIGHUP before the ranks start (waiting on --after-ok)
    ends the run through the recorded path, as CANCELLED 128+N; Python's default would die unrecorded.
    The ranks' runner installs its own handlers while they run and puts these back after. A signal
    this process was started with ignored (``nohup``: SIGHUP) stays ignored, as in the runner."""
    import signal

    def early(signum: int, frame: object) -> None:
        raise JobFailed(f"interrupted by {signal.Signals(signum).name} before the ranks started", returncode=128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) != signal.SIG_IGN:
            signal.signal(sig, early)


def _final_code(scheduler: Any, job_id: str, state: str, code: int, reason: str, hint: str,
                tries: Restarts, spec: Any, hang_timeout: Optional[float]) -> int:
    """The run's exit code, its verdict printed on stderr: the rank's own code, or its class's code
    (core/exitcodes.py) where --max-restarts supervises the run; a hang --hang-timeout stopped is its class's
    (81) too. --hang-timeout alone leaves every other ending its own code, as torchrun would."""
    if state == "COMPLETED":
        return 0
    eprint(f"Error: {reason}")
    if reason.startswith("interrupted by SIGINT") or reason.endswith("before the ranks started"):
        return code  # Ctrl-C: the user knows why; before the ranks started: no rank has anything to say
    # Where the verdict found no evidence (a tool's own Error/HINT lines, a rank that printed nothing),
    # the supervisor's hint still says where to look on the screen.
    klass = print_verdict(scheduler, job_id)
    if klass in ("", "unknown") and hint:
        eprint(f"HINT: {hint}")
    if state == "CANCELLED" and not tries.fired:
        return code  # `torchhpc cancel` or a signal: its own code, as before
    if spec.max_restarts or tries.fired:  # a supervised run ends with its class's code (core/exitcodes.py)
        return tries.exit_code(exit_code_for(klass or "unknown"))
    return code

