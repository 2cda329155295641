"""One job handle for every job command: ``SCHEDULER:ID`` or a bare id, resolved one way.

``status``, ``wait``, ``cancel``, ``logs``, ``diagnose``, ``events`` and ``top`` all take the job
through :func:`add_job_argument` and :func:`resolve`, so a bare id means the same scheduler to
each of them: ``--scheduler``, else ``$TORCHHPC_SCHEDULER``, the profile's or the config file's,
else local (the id ``torchhpc run`` prints for a local job is then enough). Before, four commands
sent a bare id to the local scheduler and four to Slurm, and the id in ``Error: job X ended
FAILED`` was "completed" to ``diagnose``.

An unknown job is one error everywhere: ``Error: no job <handle> (...)`` with ``HINT:
torchhpc list``, exit 2, never a verdict or an empty answer (git's and kubectl's rule: one
handle, one contract).
"""

from __future__ import annotations

import argparse
from typing import Any

from torchhpc.core.handle import Handle
from torchhpc.errors import TorchHPCError, UnknownJob
from torchhpc.schedulers import REGISTRY, get_scheduler, parse_handle, scheduler_class
from torchhpc.schedulers.api import JobStatus, Scheduler

__all__ = ["UNKNOWN_HINT", "add_job_argument", "default_scheduler", "known_status", "require", "resolve"]

HANDLE_HELP = "job handle: SCHEDULER:ID (local:3f2a9c1b0d, slurm:123) or a bare ID, which uses --scheduler"
SCHEDULER_HELP = "scheduler for a bare id (default: $TORCHHPC_SCHEDULER, the profile's or config file's, else local)"
UNKNOWN_HINT = "`{list}` shows the jobs; a bare id means the default scheduler (--scheduler to choose)"


def default_scheduler() -> str:
    """The scheduler for a bare id: $TORCHHPC_SCHEDULER, the profile's, the config file's, else local."""
    from torchhpc.resolve import resolve_values

    return str(resolve_values({})[1]["scheduler"].value)


def add_job_argument(p: argparse.ArgumentParser, *, more: bool = False) -> None:
    """The positional job handle and ``-s/--scheduler``, the same on every job command."""
    p.add_argument("job", metavar="JOB", help=HANDLE_HELP)
    if more:
        p.add_argument("more", nargs="*", default=[], metavar="JOB",
                       help="more handles: all jobs of a scheduler are asked in one question (one squeue, one qstat)")
    p.add_argument("-s", "--scheduler", default=None, help=SCHEDULER_HELP)


def resolve(args: argparse.Namespace, text: str | None = None) -> tuple[str, str]:
    """(scheduler, job id) of ``text`` (default ``args.job``); a bare id takes ``args.scheduler`` or the default."""
    handle = args.job if text is None else text
    if ":" in handle:
        return parse_handle(handle)
    name = getattr(args, "scheduler", None) or default_scheduler()
    scheduler_class(name)  # an unknown --scheduler is said as such, with did-you-mean
    return parse_handle(handle, name)


def unknown_job(name: str, job_id: str, why: str = "") -> UnknownJob:
    """The one "unknown job" error of every job command (exit 2: a handle is input; HINT: torchhpc list)."""
    detail = f" ({why})" if why else ""
    hint = UNKNOWN_HINT.format(list=f"torchhpc list -s {name}")
    here = name in REGISTRY and scheduler_class(name).runs_here  # the local scheduler's jobs: ids of its own
    if here and job_id.isdigit():  # local ids are hex; a number is what sbatch and qsub print
        hint = f"did you mean {Handle('slurm', job_id)}? a bare id is the default scheduler's, local, whose ids are hex"
    array_id, _, task = job_id.partition("_")
    if here and task and _has_record(name, array_id):  # a local array's tasks are runs of one job
        hint = (f"a local job array's tasks share its handle: `torchhpc logs {Handle(name, array_id)}` "
                f"shows each task's lines behind [task {task}], and `diagnose` gives each failed task's verdict")
    return UnknownJob(f"no job {Handle(name, job_id)}{detail}", hint)


def known_status(sched: Scheduler, name: str, job_id: str) -> JobStatus:
    """The job's status, or the one "unknown job" error; other scheduler errors pass unchanged.

    A scheduler says "unknown" in its own words (no record, squeue/sacct without the id, qstat's
    "Unknown Job Id"); every one of them is a :class:`SchedulerError` whose message this turns into
    the same line. Other errors (a command not installed, a record that cannot be read) keep their
    own message: they are not "no such job".
    """
    try:
        return sched.status(job_id)
    except UnknownJob as e:
        raise unknown_job(name, job_id, _short(e.message)) from None


def _short(message: str) -> str:
    """The scheduler's own reason in a few words: "no record in DIR", "unknown to scontrol and sacct"."""
    import re

    inner = re.search(r"\(([^()]*)\)\s*$", message)
    if inner:
        return inner.group(1)
    m = re.search(r"\bis (unknown to .*|not known to .*)$", message)
    return (m.group(1) if m else message).strip().rstrip(".")


def require(args: argparse.Namespace, *, record_ok: bool = False) -> tuple[Any, str, str]:
    """(scheduler object, name, id) of a job that exists; the unknown-job error otherwise.

    ``record_ok``: a job the scheduler has forgotten (Slurm without accounting, past MinJobAge) but
    whose torchhpc record is still on disk counts as known: its logs still say
    what happened, and ``logs``/``diagnose``/``events`` read them.
    """
    name, job = resolve(args)
    sched = get_scheduler(name)
    try:
        known_status(sched, name, job)
    except TorchHPCError:  # unknown to the scheduler, or its commands are not here (a copied job directory)
        if not (record_ok and _has_record(name, job)):
            raise
    return sched, name, job


def _has_record(name: str, job: str) -> bool:
    """A record of the job, or of the array whose task ``ARRAY_TASK`` is (a Slurm or PBS array records its
    ``array`` spec). A local array has no task handles: its record is one run's, so ``local:ID_5`` is no job,
    in ``logs`` and ``diagnose`` as in ``status`` (not the whole array, read as if it were task 5)."""
    from torchhpc.jobdir.record import load_record

    if load_record(name, job) is not None:
        return True
    array_id, _, task = job.partition("_")
    base = load_record(name, array_id) if task else None
    return base is not None and bool(base.array)
