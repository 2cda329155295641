"""One code per ending: the job's own end record, the controller and the accounting, reconciled here.

Three sources say how a Slurm job ended, and they disagree (issue 70's table):

- the job's own end marker, ``<job dir>/end.json``: the batch shell's exit status, written by its EXIT
  trap (:mod:`~torchhpc.jobdir.endmark`), e.g. ``CANCELLED 143`` after a cancel;
- ``scontrol``, while the controller remembers the job (``MinJobAge``): the same status, ``143:0``;
- ``sacct``, once the controller has forgotten it: ``CANCELLED by 0 | 0:0`` or ``TIMEOUT | 0:0``, a
  status over 128 less 128 or dropped (a batch shell that ended by a signal it trapped).

The README's exit-code table is the contract every reader (``run --wait``, ``wait``, ``status``,
``diagnose --json``, ``events``) gets through :func:`one_ending`, at any minute:

- the end marker of this run wins over the scheduler's word: it is the status the batch shell exited
  with, which accounting may no longer show; a marker that says CANCELLED (the batch shell's TERM trap
  ran: ``scancel``, the time limit) is 143 whatever status the stopped step left (torchrun's is 1);
- a cancel is 143 (SIGTERM, what ``scancel`` sends) whether the job ran or was still pending (a pending
  job has no batch shell, hence no marker, and Slurm records ``0:0``); so is a time-limit end that left
  no status (Slurm's SIGTERM at the limit);
- a job whose ranks took a time-limit (preemption) stop and that was not requeued ends 85 (86) from its
  batch script (schedulers/slurm/requeue.py), which Slurm records as FAILED: its state reads TIMEOUT
  (PREEMPTED), what ended it;
- a job whose batch host died under the in-allocation supervisor is cancelled by the supervisor's watch
  on another node, which writes ``NODE_FAIL`` 80 first (supervisor/sentinel.py): it reads NODE_FAIL, 80;
- a job the client's hang watch cancelled (``run --wait --hang-timeout``: its diagnosis ``hang.json`` is
  in the job directory, written just before the cancel) is the class ``hang``, 81, as ``run --wait`` says.
"""

from __future__ import annotations

import os
from typing import Optional

from torchhpc.core.exitcodes import exit_code_for
from torchhpc.jobdir.endmark import EndMark, read_end
from torchhpc.jobdir.layout import HANG
from torchhpc.schedulers.api import TERMINAL

__all__ = ["HANG_END_S", "SIGTERM_CODE", "STOPPED_WHY", "one_ending", "this_runs_mark"]

SIGTERM_CODE = 128 + 15  # scancel's and the time limit's signal, as a shell reports it
# The hang watch saves its diagnosis, then cancels: the end follows within KillWait (seconds). A diagnosis
# older than this before the end is an earlier hang the supervisor restarted from, not this end's cause.
HANG_END_S = 300.0
_SIGNALLED = frozenset({"CANCELLED", "TIMEOUT"})
# the state of an ending the batch script gave a stop's class: what ended it, not FAILED
_STOPPED = {exit_code_for("time-limit"): "TIMEOUT", exit_code_for("preempted"): "PREEMPTED",
            exit_code_for("node-failure"): "NODE_FAIL"}
# the reason status gives such an ending (Slurm's, NonZeroExitCode, was its word for FAILED)
STOPPED_WHY = {"TIMEOUT": "the ranks stopped at the time limit; not requeued, the work is unfinished",
               "PREEMPTED": "the ranks stopped on preemption; not requeued, the work is unfinished",
               "NODE_FAIL": "a node was lost (attempts.json says which)"}


def this_runs_mark(end_dir: Optional[str], restarts: int = 0) -> Optional[EndMark]:
    """The end marker in ``end_dir`` unless it is an earlier run's (a requeued job restarted since)."""
    mark = read_end(end_dir) if end_dir else None
    return None if mark is None or mark.restart < restarts else mark


def _hang_ended(end_dir: Optional[str], mark: Optional[EndMark]) -> bool:
    """Whether the hang watch's diagnosis is this end's cause: saved, and not long before the end."""
    if not end_dir:
        return False
    try:
        saved = os.stat(os.path.join(end_dir, HANG)).st_mtime  # the hang watch's saved diagnosis
    except OSError:
        return False
    return mark is None or not mark.time or mark.time - saved <= HANG_END_S


def one_ending(state: str, code: Optional[int], end_dir: Optional[str], restarts: int = 0) -> tuple[str, Optional[int]]:
    """The (state, exit code) of a job the scheduler says ended ``state`` with ``code`` (both unchanged for
    a job that has not ended): see the module docstring for the rules, the README's table for the codes."""
    word = state.split()[0] if state else ""  # sacct: "CANCELLED by 0"
    if word not in TERMINAL:
        return state, code
    code = _one_code(word, code, end_dir, restarts)
    # the batch script's own end after a stop it did not requeue (slurm/requeue.py), which Slurm calls FAILED, and
    # the watch on the supervisor's node, which cancels the job after it lost its batch host (supervisor/sentinel.py)
    if word in ("FAILED", "CANCELLED") and code in _STOPPED and this_runs_mark(end_dir, restarts) is not None:
        return _STOPPED[code], code
    return state, code


def _one_code(state: str, code: Optional[int], end_dir: Optional[str], restarts: int) -> Optional[int]:
    mark = this_runs_mark(end_dir, restarts)
    if mark is not None and mark.state == "CANCELLED" and state in _SIGNALLED:
        code = SIGTERM_CODE  # its TERM trap ran: Slurm ended it, whatever status the killed step left (torchrun: 1)
    elif mark is not None and mark.exit_code is not None:
        code = mark.exit_code
    if state == "CANCELLED" and (mark is None or mark.state == "CANCELLED") and _hang_ended(end_dir, mark):
        return exit_code_for("hang")
    if state in _SIGNALLED and not code:
        return SIGTERM_CODE
    return code
