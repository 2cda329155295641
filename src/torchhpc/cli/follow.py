"""Following a submitted job: progress while it waits, its log, its state (``run --wait``, ``wait``, ``sweep``).

Its own module so that ``run`` and ``jobs`` both use it without importing each other.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, Optional

from torchhpc.cli.common import Progress, eprint
from torchhpc.core.handle import Handle
from torchhpc.schedulers.api import JobStatus, Scheduler

__all__ = ["check_on_hang", "follow", "hang_watch", "print_verdict", "status_dict", "task_index"]


def status_dict(name: str, st: JobStatus) -> dict[str, Any]:
    out = {"handle": str(Handle(name, st.job_id)), **{k: v for k, v in vars(st).items() if k not in ("raw", "tasks")}}
    if st.tasks:
        out["tasks"] = [status_dict(name, t) for t in st.tasks]
    return out


def follow(
    scheduler: Scheduler, job_id: str, timeout: float | None = None, print_logs: bool = True,
    hang_timeout: float | None = None, on_hang: str = "cancel",
) -> int:
    """Wait with progress, print the log, exit non-zero when the job failed, with its verdict.

    With ``hang_timeout``, a job whose ranks all went quiet and idle for that long gets its
    stacks read and its culprit named, then is cancelled or requeued (torchhpc.diagnose.hang).
    """
    progress = Progress()
    watch = hang_watch(scheduler, job_id, hang_timeout, on_hang) if hang_timeout else None

    never = _NeverWatch(scheduler, job_id)

    def show(st: JobStatus, waited: float) -> None:
        if st.terminal:  # the end is said once, by the status line below
            return
        never.check(st)
        reason = f" ({st.told_reason})" if st.told_reason else ""
        progress.update(f"{Handle(scheduler.name, job_id)} {st.state}{reason} {st.elapsed_or_waited(waited)}")
        if watch is not None:
            watch.check(st.state)

    st = scheduler.wait(job_id, poll=1.0, timeout=timeout, progress=show)
    progress.done()
    if print_logs:
        if st.tasks:  # an array: every task's log, each line labelled as the local scheduler does
            for task in st.tasks:
                _print_log(scheduler, task.job_id, f"[task {task_index(task.job_id)}] ")
        else:
            _print_log(scheduler, job_id, "")
    eprint(f"{scheduler.name}:{st.line()}")  # st.line() starts with the id: one handle, not "local:ID ID"
    if st.ok or getattr(watch, "finished", False):  # every rank's program had ended: this watch stopped a hung exit
        return 0
    code = st.exit_code if st.exit_code and 0 < st.exit_code < 256 else 1
    eprint(f"Error: job {Handle(scheduler.name, job_id)} ended {st.state}" + (f" with exit code {st.exit_code}" if st.exit_code else ""))
    if not st.tasks:
        print_verdict(scheduler, job_id)
    if watch is not None and getattr(watch, "fired", False):
        from torchhpc.core.exitcodes import exit_code_for

        return exit_code_for("hang")  # this watch cancelled it: the class's code, as a supervised job's (core/exitcodes.py)
    return code


def interruptible(name: str, job_id: str, wait: Callable[[], int]) -> int:
    """``wait()``, where Ctrl-C stops the waiting, not the job: said in one line, exit 130."""
    try:
        return wait()
    except KeyboardInterrupt:
        eprint(f"\nInterrupted: stopped waiting; {Handle(name, job_id)} goes on (`torchhpc wait {Handle(name, job_id)}` to wait again, "
               f"`torchhpc cancel {Handle(name, job_id)}` to stop it)")
        return 130


class _NeverWatch:
    """A wait stops on a job that can never run as it stands (the scheduler's own reason, or the partition's
    nodes: schedulers' ``explain_pending``), instead of printing a line a second forever. Asked once per
    reason the scheduler gives, so a job that waits for resources costs one round of questions, not one a poll."""

    def __init__(self, scheduler: Scheduler, job_id: str) -> None:
        self.scheduler, self.job_id, self.asked = scheduler, job_id, set[str]()

    def check(self, st: JobStatus) -> None:
        if st.state != "PENDING" or st.reason in self.asked:
            return
        self.asked.add(st.reason)
        try:
            why = self.scheduler.explain_pending(st)
        except Exception:  # an explanation is a courtesy: the wait goes on
            return
        if why is not None and why.category == "never":
            from torchhpc.errors import UsageError

            handle = str(Handle(self.scheduler.name, self.job_id))
            raise UsageError(f"job {handle}: {why.summary}; not waiting for it",
                             f"it stays in the queue until `torchhpc cancel {handle}`; then "
                             + (why.action or "submit what fits"))


def check_on_hang(scheduler: Scheduler, on_hang: str) -> None:
    """Refuse ``--on-hang requeue`` where the scheduler cannot requeue (docs/capabilities.md)."""
    if on_hang == "requeue" and not type(scheduler).supports_requeue:
        from torchhpc.errors import UsageError

        raise UsageError(f"--on-hang requeue: the {scheduler.name} scheduler cannot requeue a job",
                         "use --on-hang cancel (the default), or a scheduler that requeues (slurm)")


def hang_watch(scheduler: Scheduler, job_id: str, hang_timeout: float, on_hang: str,
               act: Optional[Callable[[str], None]] = None) -> Any:
    """The hang watch for a job torchhpc submitted (None when its per-rank files are unknown).

    ``act`` replaces the default action (cancel, or ``scontrol requeue``) once the hang is named.
    """
    from torchhpc.diagnose.hang import watch_job

    check_on_hang(scheduler, on_hang)
    return watch_job(scheduler, job_id, hang_timeout, on_hang, act, eprint)


def print_verdict(scheduler: Scheduler, job_id: str) -> str:
    """The failure's verdict (at most 8 lines) after the job's output: which rank, where, why.
    Returns its class ("" when there is none to print), so a caller can add what the verdict lacks."""
    from torchhpc.diagnose.readback import diagnose_job, printable

    try:
        verdict = diagnose_job(scheduler, scheduler.name, job_id)
    except Exception as e:  # the verdict is a courtesy; the exit code above is the answer
        eprint(f"(no diagnosis: {e})")
        return ""
    text = printable(verdict)  # none for a job that never ran: its error line says why
    if text is None:
        return ""
    sys.stderr.write(text)
    sys.stderr.flush()
    return verdict.klass


def task_index(job_id: str) -> str:
    """An array task's index: Slurm ``29_3`` and PBS ``29[3].server`` -> ``3`` (else the id itself)."""
    import re

    m = re.search(r"_(\d+)$|\[(\d+)\]", job_id)
    return (m.group(1) or m.group(2)) if m else job_id


def _print_log(scheduler: Scheduler, job_id: str, label: str) -> None:
    """Print a job's (or one task's) log, ``label`` before every line; a log that cannot be read is
    said in one line (the state, printed after, is the answer)."""
    try:
        text = scheduler.logs(job_id)
    except Exception as e:  # logs are a courtesy here
        eprint(f"{label}(no log: {e})")
        return
    if label:
        text = "".join(label + line for line in text.splitlines(keepends=True))
    if text:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        sys.stdout.flush()
