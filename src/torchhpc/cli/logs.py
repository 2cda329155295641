"""``torchhpc logs``: a job's output, every line attributed to its rank.

Rank lines print as ``[rankN]: text``; with exactly one ``--rank``, as the rank
wrote them. Lines of the job itself (torchhpc, the scheduler, the launchers)
print as they are and only without a rank or node filter.
"""

from __future__ import annotations

import argparse
import re
import sys
import threading
import time
from collections.abc import Sequence
from contextlib import suppress
from typing import Any, Optional

from torchhpc.cli.common import add_subparser
from torchhpc.cli.handles import add_job_argument, require
from torchhpc.cli.remote import add_remote_arguments
from torchhpc.core.handle import Handle
from torchhpc.errors import SchedulerError, UsageError
from torchhpc.jobdir.logs import (
    MAX_RANKS,
    JobLog,
    Line,
    format_ranks,
    job_log,
    parse_ranks,
    select,
)
from torchhpc.jobdir.record import read_record
from torchhpc.jobdir.tracebacks import first_tracebacks
from torchhpc.schedulers.api import Scheduler

# How often -f looks for new lines and asks the scheduler whether the job ended.
FOLLOW_POLL = 0.25
STATUS_EVERY = 1.0


def register(sub: Any) -> None:
    p = add_subparser(sub, "logs", "print a job's output: all ranks, some ranks or nodes, matches, tracebacks")
    add_job_argument(p)
    p.add_argument("-f", "--follow", action="store_true", help="print new lines as they come until the job ends")
    p.add_argument("--rank", default=None, metavar="RANKS", help="only these ranks' lines: 3, 3,7 or 0-3,8")
    p.add_argument("--node", default=None, metavar="NODES", help="only ranks on these nodes: node12, node[1-4],node9")
    p.add_argument("--grep", default=None, metavar="PATTERN", help="only lines matching this regular expression (shown with their rank)")
    p.add_argument("--errors", action="store_true", help="the first traceback of each failing rank, the rank that failed first on top")
    add_remote_arguments(p)
    p.set_defaults(func=cmd_logs)


def _ranks(spec: Optional[str]) -> Optional[list[int]]:
    if spec is None:
        return None
    try:
        return parse_ranks(spec)
    except ValueError as e:
        raise UsageError(
            f"--rank {spec!r} is not a rank list: {e}",
            f"give ranks like 3, 3,7 or 0-3,8 (ranges low-high, at most {MAX_RANKS} ranks)",
        ) from None


def _nodes(spec: Optional[str]) -> Optional[list[str]]:
    if spec is None:
        return None
    from torchhpc.core.hostlist import expand

    try:
        return expand(spec)
    except Exception:
        raise UsageError(f"--node {spec!r} is not a node list", "give nodes like node12 or node[1-4],node9") from None


def _grep(pattern: Optional[str]) -> Optional[re.Pattern[str]]:
    if pattern is None:
        return None
    try:
        return re.compile(pattern)
    except re.error as e:
        raise UsageError(f"--grep {pattern!r} is not a regular expression ({e})", "quote it; escape ( [ . * with a backslash") from None


def _node_of(sched: Scheduler, job: str, log: JobLog) -> dict[int, str]:
    """Rank -> node: from the per-rank files' names, else Slurm's block layout over the job's nodes."""
    found = log.nodes()
    if found:
        return found
    from torchhpc.core.hostlist import expand

    try:
        hosts = expand(sched.status(job).nodes)
    except Exception:
        return {}
    per = max(1, log.nproc_per_node)
    return {r: hosts[r // per] for r in range(len(hosts) * per)}


def _as_written(ln: Line) -> str:
    return ln.text if ln.task is None else f"[task {ln.task}] {ln.text}"


def cmd_logs(args: argparse.Namespace) -> int:
    ranks, nodes, grep = _ranks(args.rank), _nodes(args.node), _grep(args.grep)
    sched, name, job = require(args, record_ok=True)
    if "_" not in job and read_record(name, job).array:
        raise UsageError(
            f"{Handle(name, job)} is a job array: each task has its own log",
            f"name one task: torchhpc logs {Handle(name, job)}_0 (torchhpc status {Handle(name, job)} lists the tasks)",
        )
    try:
        paths = sched.log_paths(job)
    except SchedulerError:
        paths = []
    log = job_log(name, job, output=paths[0] if paths else None)
    if log is None:  # kubernetes, runai, or a job submitted elsewhere: the scheduler's own text
        return _scheduler_text(sched, job, ranks, args.follow)
    node_of = _node_of(sched, job, log) if nodes is not None else {}
    single = ranks is not None and len(ranks) == 1 and grep is None

    def emit(lines: Sequence[Line]) -> None:
        chosen = select(lines, ranks, nodes, node_of, grep)
        if grep is not None:
            chosen = [ln for ln in chosen if ln.rank is not None]
        # one rank: as it wrote them, behind its task where the log is an array's (rank 0 of every task)
        sys.stdout.write("".join((_as_written(ln) if single else ln.show()) + "\n" for ln in chosen))
        sys.stdout.flush()

    if args.errors:
        lines = log.read(final=True)
        tbs = first_tracebacks(select(lines, ranks, nodes, node_of), log.failure_order())
        if not tbs:
            from torchhpc.diagnose.classify import native_crashes  # the crash classifier: --errors without a traceback only

            crashes = native_crashes(select(lines, ranks, nodes, node_of))
            if crashes:  # `terminate called ...`, a segfault: no Python traceback, but the cause
                sys.stdout.write("".join(f"=== rank {r} ===\n{t}\n" for r, t in crashes))
                print(f"(no Python traceback; which rank crashed first: torchhpc diagnose {Handle(name, job)})", file=sys.stderr)
                return 0
            print("No traceback in this job's log.", file=sys.stderr)
            return 0
        sys.stdout.write(tbs.render())
        return 0
    if not args.follow:
        lines = log.read(final=True)
        if ranks is not None or nodes is not None:
            rec = read_record(name, job)
            # the job's size where its record knows it: a run here is one node (a batch job's record may not say
            # how many nodes its allocation had: no size, the rank lines alone decide)
            world = rec.nproc_per_node if sched.runs_here and rec.submitted else 0
            _check_present(str(Handle(name, job)), lines, ranks, nodes, node_of, args.node, world)
        emit(lines)
        return 0
    ended = threading.Event()

    def watch() -> None:  # the scheduler may answer slowly: never hold the printing up
        from torchhpc.schedulers.waiting import EndWatch

        end = EndWatch(lambda: sched.status(job), sched.end_dir(job), poll=STATUS_EVERY,
                       controller=sched.queries_controller)  # the end marker first (schedulers/waiting.py)
        while not ended.is_set():
            with suppress(SchedulerError):
                end.step()
                if end.ended:
                    ended.set()
                    return
            time.sleep(end.pause())

    threading.Thread(target=watch, daemon=True).start()
    while not ended.is_set():
        emit(log.read())
        ended.wait(FOLLOW_POLL)
    time.sleep(FOLLOW_POLL)  # the last writes of a rank may land just after the job ends
    emit(log.read(final=True))
    return 0


def _check_present(
    handle: str,
    lines: Sequence[Line],
    ranks: Optional[list[int]],
    nodes: Optional[list[str]],
    node_of: dict[int, str],
    node_spec: Optional[str],
    world: int = 0,
) -> None:
    """Refuse a --rank/--node filter that matches no rank of a log that has rank lines, and a rank beyond the
    job's size (its record's nodes x ranks per node) in any log.

    A log without rank lines (nothing attributed yet, or a launcher torchhpc cannot
    parse) prints as before: empty, for a rank the job has.
    """
    beyond = [r for r in ranks or () if world and r >= world]
    if beyond and len(beyond) == len(ranks or ()):
        raise UsageError(f"{handle} has no {'rank' if len(beyond) == 1 else 'ranks'} {format_ranks(beyond)}",
                         f"its ranks are 0-{world - 1}" if world > 1 else "its only rank is 0")
    present = sorted({ln.rank for ln in lines if ln.rank is not None})
    if not present or select(lines, ranks, nodes, node_of):
        return
    asked = "any rank"
    if ranks is not None:
        asked = ("rank " if len(ranks) == 1 else "ranks ") + format_ranks(ranks)
    if nodes is not None:
        asked += f" on {node_spec}"
    has = ("rank " if len(present) == 1 else "ranks ") + format_ranks(present)
    if nodes is not None:
        on = sorted({ln.node or node_of.get(ln.rank, "") for ln in lines if ln.rank is not None} - {""})
        if on:
            has += " on " + ",".join(on)
    raise UsageError(f"the log of {handle} has no line from {asked}", f"the log has {has}")


def _scheduler_text(sched: Scheduler, job: str, ranks: Optional[list[int]], follow: bool) -> int:
    """Backends whose logs are text from their own tool (``kubectl logs``): one rank or all."""
    if ranks is not None and len(ranks) != 1:
        raise UsageError(f"the {sched.name} scheduler gives one rank's log at a time", "give a single --rank")
    rank = ranks[0] if ranks else None
    printed = 0
    while True:
        text = sched.logs(job, rank=rank)
        sys.stdout.write(text[printed:])
        sys.stdout.flush()
        printed = len(text)
        if not follow or sched.status(job).terminal:
            return 0
        time.sleep(1.0)
