"""``torchhpc status|cancel|wait|list``: follow jobs by handle (``slurm:123``, ``local:ID`` or a bare id)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from torchhpc.cli.common import add_hang_arguments, add_subparser, eprint, json_errors, print_json
from torchhpc.cli.follow import follow, interruptible, status_dict
from torchhpc.cli.handles import UNKNOWN_HINT, add_job_argument, default_scheduler, known_status, require, resolve
from torchhpc.cli.remote import add_remote_arguments
from torchhpc.core.exitcodes import help_table
from torchhpc.core.handle import Handle
from torchhpc.core.units import plural
from torchhpc.errors import CommandError, CommandNotFound, TorchHPCError, UnknownJob, UsageError
from torchhpc.schedulers import get_scheduler
from torchhpc.schedulers.api import UNENDED, JobStatus, Scheduler

EXIT_CODES = help_table()

# What to use where torchhpc cannot list a scheduler's jobs itself.
_LIST_ELSEWHERE = {
    "kubernetes": "`kubectl get pytorchjobs` (add -n NAMESPACE) lists them",
    "runai": "`runai list jobs` lists them",
}


def register(sub: Any) -> None:
    p = add_subparser(sub, "status", "show a job's state, exit code, reason and restarts (several: one query)")
    p.epilog = EXIT_CODES
    add_job_argument(p, more=True)
    p.add_argument("--json", action="store_true", help="machine-readable output (errors too)")
    add_remote_arguments(p)
    p.set_defaults(func=cmd_status)

    p = add_subparser(sub, "cancel", "cancel a job")
    add_job_argument(p)
    add_remote_arguments(p)
    p.set_defaults(func=cmd_cancel)

    p = add_subparser(sub, "wait", "wait for a job to end, showing progress; exit non-zero if it failed")
    p.epilog = EXIT_CODES
    add_job_argument(p)
    p.add_argument("--timeout", type=float, default=None, help="give up after this many seconds")
    p.add_argument("--logs", action="store_true", help="print the job's log at the end")
    add_hang_arguments(p)
    add_remote_arguments(p)
    p.set_defaults(func=cmd_wait)

    p = add_subparser(sub, "list", "list your jobs (local: every run with a record, foreground and background, "
                      "newest last; others: queued and running)")
    p.add_argument("-s", "--scheduler", default=None,
                   help="whose jobs (default: $TORCHHPC_SCHEDULER, the config file's, else local)")
    p.add_argument("--last", action="store_true",
                   help="only the newest job's handle (J=$(torchhpc list --last)); with --json, its whole record; "
                        "exit 1 when there is none")
    p.add_argument("--prune", type=_days, default=None, metavar="DAYS",
                   help="local: forget ended jobs older than DAYS (their records and logs); running ones stay")
    p.add_argument("--json", action="store_true", help="machine-readable output (errors too)")
    add_remote_arguments(p)
    p.set_defaults(func=cmd_list)


@json_errors
def cmd_status(args: argparse.Namespace) -> int:
    if args.more:
        return _status_many(args)
    from torchhpc.schedulers.dependencies import job_dependencies

    name, job = resolve(args)
    from torchhpc.supervisor.show import attempt_lines, job_attempts

    sched = get_scheduler(name)
    st = known_status(sched, name, job)
    pending = sched.explain_pending(st) if st.state in ("PENDING", "QUEUED", "HELD") else None
    tries = job_attempts(name, job, sched.end_dir(job))  # each attempt of a restarted job (docs/resilience.md)
    after = job_dependencies(sched, job)  # what it waits (or waited) for, each with its job's state now
    if args.json:
        deps = [{"kind": d.dependency.kind, "handle": d.handle, "state": d.state, "verdict": d.verdict} for d in after]
        print_json({**status_dict(name, st), "attempts": tries, "pending": pending.to_json() if pending else None,
                    **({"after": deps} if deps else {})})
    else:
        print(f"{name}:{st.line()}")
        if pending is not None:
            print("\n".join(pending.lines()))
        if tries:
            print(*attempt_lines(tries), sep="\n")
        for dep in after:
            print(f"  {dep.line()}")
        if st.state == "RUNNING":
            _print_progress(name, job)
    return 0


def _status_many(args: argparse.Namespace) -> int:
    """Several handles: one ``query_many`` per scheduler (Slurm: one squeue for all), in the order given."""
    handles = [resolve(args, text) for text in [args.job, *args.more]]
    by_sched: dict[str, list[str]] = {}
    for name, job in handles:
        by_sched.setdefault(name, []).append(job)
    found = {name: get_scheduler(name).query_many(jobs) for name, jobs in by_sched.items()}
    missing = [str(Handle(name, job)) for name, job in handles if job not in found[name]]
    if args.json:
        print_json([status_dict(name, found[name][job]) for name, job in handles if job in found[name]])
    else:
        for name, job in handles:
            if job in found[name]:
                print(f"{name}:{found[name][job].line()}")
    if missing:
        raise UnknownJob(f"no job {', '.join(missing)}", UNKNOWN_HINT.format(list="torchhpc list"))
    return 0


def _print_progress(name: str, job: str) -> None:
    """Per node, how long ago each rank last printed: the quiet rank shows before a hang timeout."""
    import time

    from torchhpc.jobdir.logs import job_log
    from torchhpc.observe.progress import progress_lines

    log = job_log(name, job)
    if log is not None and log.ranks_dir and os.path.isdir(log.ranks_dir):
        for line in progress_lines(log.ranks_dir, time.time()):
            print(line)


def _finished(sched: Scheduler, job: str) -> JobStatus | None:
    """The job's status when it has ended; None while it runs, or when the scheduler cannot say."""
    try:
        st = sched.status(job)
    except TorchHPCError:
        return None  # unknown here: cancel itself gives the scheduler's answer
    return st if st.terminal else None


def cmd_cancel(args: argparse.Namespace) -> int:
    """Cancel; a job that has already ended is said so (exit 0), never reported as cancelled."""
    name, job = resolve(args)
    sched = get_scheduler(name)
    st = known_status(sched, name, job)  # an unknown job is said so, never "cancelled"
    # the job's own end file may say it ended while the scheduler still runs it (a batch host lost: issue 70);
    # the scheduler's own state (``raw``) decides whether there is something to cancel
    done = st if st.terminal and st.raw.get("JobState") not in UNENDED else None
    if done is None:
        try:
            sched.cancel(job)
        except CommandError:
            done = _finished(sched, job)  # it ended between the two questions (scancel: already completing)
            if done is None:
                raise
    if done is not None:
        code = f", exit code {done.exit_code}" if done.exit_code is not None else ""
        print(f"{Handle(name, job)} had already finished ({done.state}{code}): nothing to cancel")
        return 0
    print(f"Cancelled {Handle(name, job)}")
    return 0


def cmd_wait(args: argparse.Namespace) -> int:
    sched, name, job = require(args)
    return interruptible(name, job, lambda: follow(sched, job, timeout=args.timeout, print_logs=args.logs,
                                                   hang_timeout=args.hang_timeout, on_hang=args.on_hang))


def _days(text: str) -> float:
    try:
        days = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of days") from None
    if days < 0:
        raise argparse.ArgumentTypeError(f"{text}: days cannot be negative")
    return days


@json_errors
def cmd_list(args: argparse.Namespace) -> int:
    name = args.scheduler or default_scheduler()
    sched = get_scheduler(name)
    if args.prune is not None:
        return _prune(sched, name, args.prune, args.json)
    if type(sched).list_jobs is Scheduler.list_jobs:
        raise UsageError(
            f"torchhpc cannot list {name} jobs",
            _LIST_ELSEWHERE.get(name, "ask the scheduler itself") + f"; `torchhpc status {name}:ID` follows one",
        )
    try:
        jobs = sched.list_jobs()
    except CommandNotFound as e:
        if not e.hint:  # never a bare "command not found": say where the command lives
            e.hint = getattr(sched, "submit_hint", "") or (
                f"`{e.argv[0]}` is not on PATH here: run this where the {name} commands are")
        raise
    if args.last:
        jobs = _last(sched, name, jobs)
    if args.json:
        print_json([status_dict(name, st) for st in jobs])
        return 0 if jobs or not args.last else 1
    if args.last and jobs:
        print(Handle(name, jobs[-1].job_id))
        return 0
    for st in jobs:
        print(f"{name}:{st.line()} name={st.name}")
    if not jobs:
        eprint(f"no {name} jobs" + ("" if sched.runs_here else " queued or running"))
    return 1 if args.last and not jobs else 0


def _last(sched: Scheduler, name: str, queued: list[JobStatus]) -> list[JobStatus]:
    """``list --last``: the job submitted last from here, queued or ended (a cluster's queue forgets a job that
    ended: after a short ``run --wait`` it printed nothing); the queue's last where torchhpc kept no record."""
    from torchhpc.jobdir.record import newest_record

    newest = None if sched.runs_here else newest_record(name)
    if newest is None:
        return queued[-1:]
    try:
        return [sched.status(newest.job_id)]
    except TorchHPCError:  # forgotten by the scheduler too: the queue's word
        return queued[-1:]


def _prune(sched: Scheduler, name: str, days: float, as_json: bool) -> int:
    """``list --prune DAYS``: the local store only grows otherwise (issue 50)."""
    forget = getattr(sched, "prune", None)
    if forget is None:
        raise UsageError(f"--prune: torchhpc keeps no store of {name} jobs to prune",
                         f"the {name} scheduler forgets its jobs itself; --prune is for local jobs")
    gone = forget(days)
    if as_json:
        print_json({"pruned": [str(Handle(name, j)) for j in gone]})
    else:
        eprint(f"forgot {len(gone)} ended {name} {plural(len(gone), 'job')} older than {days:g} {plural(days, 'day')}")
    return 0
