"""``torchhpc top JOB``: every rank of a running job, refreshed every 2 s; the straggler flagged.

Per rank: host, state, CPU %, resident memory, GPU utilization and memory (where nvidia-smi or
rocm-smi exist on the node), seconds since its last output line, its progress read from its own
output (tqdm, Lightning, the Hugging Face Trainer, or ``torchhpc.dist.mark_step``), and the share
of its stack samples inside a torch.distributed collective. The rank whose share is far below the
median of the others is the straggler: they wait for it (docs/observe.md, "top").
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Optional

from torchhpc.cli.common import add_subparser, json_errors, print_json
from torchhpc.cli.handles import add_job_argument, known_status, resolve
from torchhpc.core.handle import Handle
from torchhpc.errors import SchedulerError, UsageError
from torchhpc.schedulers import get_scheduler, scheduler_class


def register(sub: Any) -> None:
    p = add_subparser(sub, "top", "a live table of a running job's ranks: CPU, memory, GPU, quiet time, progress, "
                      "time in collectives, the straggler", __doc__)
    add_job_argument(p)
    p.add_argument("--once", action="store_true", help="print one table and exit")
    p.add_argument("--json", action="store_true", help="one JSON list, one object per rank (implies --once)")
    p.add_argument("--rank", default=None, metavar="RANKS", help="only these ranks: 3, 3,7 or 0-3,8")
    p.add_argument("--node", default=None, metavar="NODES", help="only ranks on these nodes: node12, node[1-4],node9 (only they are probed)")
    p.add_argument("--interval", type=float, default=2.0, metavar="SECONDS", help="seconds between refreshes (default 2)")
    p.add_argument("--dry-run", action="store_true", help="print the per-node probe command and touch nothing")
    p.set_defaults(func=cmd_top)


@json_errors
def cmd_top(args: argparse.Namespace) -> int:
    from torchhpc.cli.logs import _nodes, _ranks

    name, job = resolve(args)
    ranks, nodes = _ranks(args.rank), _nodes(args.node)
    if not args.interval >= 0.5:
        raise UsageError(f"--interval {args.interval:g}: refreshing more often than twice a second shows nothing new",
                         "give --interval 0.5 or more (default 2)")
    if not getattr(scheduler_class(name), "supports_rank_probe", False):
        raise UsageError(
            f"torchhpc top cannot reach the ranks of a {name} job (no per-node probe for it yet)",
            "`torchhpc status` and `torchhpc logs -f` follow it; top works for local, slurm and pbs jobs",
        )
    sched = get_scheduler(name)
    alloc = sched.allocation_of(job)
    if args.dry_run:
        from torchhpc.core.shell import join
        from torchhpc.observe.live import stream_argv
        from torchhpc.observe.top import sample_argv

        print(f"# torchhpc top {Handle(name, job)}: nothing runs on a dry run; NODES: the job's nodes when it runs")
        if alloc.here:
            print("# --once: in this process (/proc and py-spy on this machine)")
        else:
            print("# --once, one task per node:")
            print(join(sample_argv(alloc, ["NODES"])))
        print("# live, one stream per node for the session:")
        print(join(stream_argv(alloc, ["NODES"], args.interval)))
        return 0
    known_status(sched, name, job)  # an unknown job is said so, not an empty table
    once = args.once or args.json
    live: Any = None
    try:
        while True:
            rows, line, live = _look(sched, alloc, ranks, nodes, None if once else (live or True), args.interval)
            if args.json:
                print_json([r.to_json() for r in rows])
                return 0
            _show(line, rows, clear=not once and sys.stdout.isatty())
            if once or line.endswith("ended"):
                return 0
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0
    finally:
        if live not in (None, True):
            live.close()


def _show(line: str, rows: Any, clear: bool) -> None:
    from torchhpc.observe.top import table

    out = [line, *(table(rows) if rows else [])]
    sys.stdout.write(("\033[H\033[J" if clear else "") + "\n".join(out) + "\n")
    sys.stdout.flush()


def _look(sched: Any, alloc: Any, ranks: Optional[list[int]], nodes: Optional[list[str]],
          live: Any, every: float) -> tuple[Any, str, Any]:
    """(the rows, the title line, the live probe); the rows are [] while the job waits or after it ended.

    ``live`` None: one look (``--once``); True: start the per-node stream; else the stream to read."""
    from torchhpc.jobdir.logs import job_log, task_record
    from torchhpc.observe.live import LiveProbe, stream_argv
    from torchhpc.observe.top import gather, probe_nodes

    name, job = sched.name, alloc.job_id
    st = sched.status(job)
    title = f"{Handle(name, job)} {st.state}" + (f" elapsed {st.elapsed}" if st.elapsed else "")
    if st.terminal:
        return [], title + ": ended", live
    if st.state != "RUNNING":
        reason = f" ({st.told_reason})" if st.told_reason else ""
        return [], f"{title}{reason}: no rank runs yet", live
    on = alloc.nodes(st)  # the status just read: not asked again
    if nodes is not None:
        on = [n for n in on if n in nodes]
        if not on:
            raise UsageError(f"--node: none of {','.join(nodes)} is a node of {Handle(name, job)} ({st.nodes})",
                             "give nodes the job runs on (torchhpc status shows them)")
    if live is None:
        try:
            samples = probe_nodes(alloc, on)
        except RuntimeError as e:
            raise SchedulerError(str(e), "is the job still running? `torchhpc status` says") from None
    else:
        if live is True or not live.alive():
            live = LiveProbe(stream_argv(alloc, on, every), alloc.runner.env)
        samples = live.latest(wait_s=30.0)
    rec = task_record(name, job)
    world = rec.nodes * rec.nproc_per_node if rec.job_id and nodes is None else None
    rows = gather(samples, job_log(name, job), world)
    if nodes is not None and not alloc.here:
        rows = [r for r in rows if r.host in nodes]
    if ranks is not None:
        rows = [r for r in rows if r.rank in set(ranks)]
    return rows, title, live
