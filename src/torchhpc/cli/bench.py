"""``torchhpc bench``: nccl-tests in Python, and the reports users trust.

``torchhpc bench all_reduce -b 1K -e 64M -f 4`` runs *in this process as one
rank*: start it under a launcher (``torchhpc run -n 2 -m torchhpc.bench
all_reduce ...``, srun, torchrun, mpirun). ``explain``, ``report`` and
``sweep`` run on a login node; ``gpu`` checks the node it runs on.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
from typing import Any

from torchhpc.bench.command import (
    add_bench_commands,
    bench_flags,
    config_from_args,
    env_default,
    size_arg,
)
from torchhpc.cli.common import Progress, add_subparser, after_dashdash, announce_target, help_when_bare
from torchhpc.core.units import counted, plural
from torchhpc.errors import JobFailed, UsageError

EXAMPLES = """examples:
  torchhpc run -n 2 -m torchhpc.bench all_reduce -b 1K -e 64M -f 4 -c 1
  srun -N 2 --ntasks-per-node 4 python -m torchhpc.bench all_reduce -b 8 -e 1G -f 2 --json ar.json
  torchhpc bench run -t all_reduce,all_gather -b 1M -e 256M -f 2 --plot bw.png   (under a launcher)
  torchhpc bench explain
  torchhpc bench gpu
  torchhpc bench sweep --scheduler slurm --nodes 1,2,4 --nproc-per-node 4 --out sweep/ -- -b 1M -e 1G -f 2
  torchhpc bench report sweep/ -o sweep/
  torchhpc bench nodes --scheduler slurm --nodes 4 --exclude-file bad.txt   (then: torchhpc run --exclude @bad.txt ...)
"""


def register(sub: Any) -> None:
    p = add_subparser(sub, "bench", "collective benchmarks (nccl-tests semantics), GPU checks, sweeps, reports",
                      __doc__)
    p.epilog = EXAMPLES
    bsub = p.add_subparsers(dest="bench_command", metavar="WHAT")
    add_bench_commands(bsub)
    from torchhpc.cli.jobargs import add_job_arguments

    s = bsub.add_parser(
        "sweep", conflict_handler="resolve", formatter_class=argparse.RawDescriptionHelpFormatter,
        help="one job per node count through a scheduler, then the report",
        description="Submit `python -m torchhpc.bench` once per node count (the normal scheduler path, "
                    "containers included), wait, collect the JSON, write report.md and busbw.png.\n"
                    "Bench flags go after --, e.g. -- -b 1M -e 256M -f 2.",
    )
    add_job_arguments(s, program=False)
    s.add_argument("-N", "--nodes", required=True, help="node counts, comma-separated: 1,2,4")
    s.add_argument("--collective", dest="sweep_collective", default="all_reduce",
                   help="collective(s) for every job (default all_reduce)")
    s.add_argument("--out", default="bench-sweep", help="folder for JSON, logs and the report (default bench-sweep)")
    s.add_argument("--timeout", type=float, default=None, help="seconds to wait for each job (default: no limit)")
    s.add_argument("--dry-run", action="store_true", help="print every job the sweep would submit; submit nothing")
    s.add_argument("bench_args", nargs=argparse.REMAINDER, help="-- then bench flags for every job")
    s.set_defaults(func=cmd_sweep)

    _register_nodes(bsub)
    help_when_bare(p)


NODES_DESCRIPTION = """\
Find the slow node, GPU or link of an allocation in one job: per node a compute check (GPU matmul and
copy, CPU matmul and copy otherwise) and an all_reduce among the node's ranks, each against the median
node; then a ring of node pairs (2 rounds of pairs running at the same time; 3 for an odd count), every
node whose pairs are all slow confirmed against a known-good node, a slow pair between good nodes measured
again.
Each pair runs a 2-node all_reduce of --size bytes; a node's pairwise figure is its best pair.
Re-measured pairs are compared with a reference pair of good nodes measured at the same moment.
SLOW: below --slow-ratio x the median. Exit 1 when a node is SLOW or FAIL (the table says which).

Nodes: --nodes N, --nodelist node[1-4], or (inside salloc, no --nodes) the allocation itself.
-s is --size here; write --scheduler in full."""


def _register_nodes(bsub: Any) -> None:
    from torchhpc.cli.jobargs import add_job_arguments

    s = bsub.add_parser(
        "nodes", conflict_handler="resolve", formatter_class=argparse.RawDescriptionHelpFormatter,
        help="find the bad node: per-node checks and node pairs in one job, a PASS/SLOW/FAIL table",
        description=NODES_DESCRIPTION,
    )
    add_job_arguments(s, program=False)
    g = s.add_argument_group("bench nodes")
    g.add_argument("--nodelist", default=None, metavar="HOSTLIST", help="exactly these nodes, e.g. node[1-4] (Slurm)")
    g.add_argument("-s", "--size", type=size_arg, default=env_default("--size", "64M"),
                   help="bytes per pair all_reduce (default 64M) [TORCHHPC_SIZE]")
    g.add_argument("--iters", type=int, default=5,
                   help="timed calls per pair and per node check (default 5; a slow pair stops after 6 s)")
    g.add_argument("--stat", choices=("best", "median"), default="best",
                   help="which call counts: best (default; load from elsewhere only slows a call, a bad link or GPU "
                        "is slow in every call) or median (also catches a link that is slow now and then)")
    g.add_argument("--slow-ratio", type=float, default=env_default("--slow-ratio", 0.7, float),
                   help="SLOW below this fraction of the median (default 0.7) [TORCHHPC_SLOW_RATIO]")
    g.add_argument("--budget", type=float, default=env_default("--budget", 180.0, float), metavar="SECONDS",
                   help="wall time for the whole run, queue included; rounds that do not fit are skipped, "
                        "a job still running after it is cancelled (default 180) [TORCHHPC_BUDGET]")
    g.add_argument("--out", default="bench-nodes", help="folder the nodes share for the script, log and JSON (default bench-nodes)")
    g.add_argument("--json", default=None, metavar="FILE", help="also write the full result as JSON here")
    g.add_argument("--exclude-file", default=None, metavar="FILE",
                   help="write the SLOW/FAIL nodes, one a line, for `torchhpc run --exclude @FILE`")
    g.add_argument("--dry-run", action="store_true", help="print the job that would run, submit nothing")
    s.set_defaults(func=cmd_nodes)


def cmd_sweep(args: argparse.Namespace) -> int:
    from torchhpc.bench.sweep import parse_nodes, plan, run_sweep, write_report
    from torchhpc.cli.jobargs import spec_from_args
    from torchhpc.schedulers import get_scheduler, scheduler_class

    rest = after_dashdash(args.bench_args)
    # Check the bench flags here, not minutes later in the first job's log.
    check = argparse.ArgumentParser(prog="torchhpc bench sweep -- ", parents=[bench_flags()], add_help=False)
    bench = check.parse_args(rest)
    config_from_args(argparse.Namespace(**vars(bench), first=args.sweep_collective))
    nodes = parse_nodes(args.nodes)
    base_args = copy.copy(args)
    base_args.nodes = 1
    base_args.module = "torchhpc.bench"
    if base_args.name is None:
        base_args.name = "bench-" + args.sweep_collective.replace(",", "-")
    base = spec_from_args(base_args, [])
    if max(nodes) > 1 and not scheduler_class(base.scheduler).supports_multi_node:
        raise UsageError(f"--nodes {args.nodes} with the local scheduler (one machine)",
                         "give --scheduler slurm (or pbs, kubernetes) for a sweep over node counts")
    jobs = plan(base, nodes, args.sweep_collective, rest, args.out)
    scheduler = get_scheduler(base.scheduler)
    announce_target(scheduler, dry_run=args.dry_run)
    if args.dry_run:  # every job, as `run --dry-run` shows one; nothing written, nothing submitted
        for i, job in enumerate(jobs, 1):
            print(f"# === sweep job {i} of {len(jobs)}: {counted(job.nodes, 'node')}, result {job.json_path} ===")
            sys.stdout.write(str(scheduler.render(job.spec)))
        print(f"# then: wait for each, write {os.path.join(args.out, 'report.md')} and busbw.png from the results")
        return 0
    progress = Progress()
    failed = run_sweep(jobs, scheduler, timeout=args.timeout, progress=progress.update)
    progress.done()
    done = [j.json_path for j in jobs if os.path.exists(j.json_path)]
    if done:
        md, png = write_report(done, args.out, collective=None)
        with open(md) as fh:
            sys.stdout.write(fh.read())
        print(f"\nReport: {md}" + (f"\nPlot:   {png}" if png else ""))
    if failed:
        hint = f"their logs are in {args.out}; `torchhpc logs SCHEDULER:JOBID` shows one"
        if base.container is not None:
            hint += ("; in a container the image's python must import torchhpc (install it in the image, "
                     "or --bind a checkout and --env PYTHONPATH=CHECKOUT/src) and --out must be bound in")
        raise JobFailed(f"{counted(len(failed), 'sweep job')} failed: " + "; ".join(failed), hint)
    return 0


def cmd_nodes(args: argparse.Namespace) -> int:
    import time

    from torchhpc.bench import nodes_job
    from torchhpc.bench import nodes_plan as plan
    from torchhpc.cli.jobargs import spec_from_args
    from torchhpc.launchers import SRUN
    from torchhpc.schedulers import get_scheduler

    started = time.time()
    if args.slow_ratio <= 0 or args.slow_ratio >= 1:
        raise UsageError(f"--slow-ratio {args.slow_ratio} must be between 0 and 1", "e.g. --slow-ratio 0.7")
    if args.iters < 1:
        raise UsageError(f"--iters {args.iters} must be at least 1")
    base_args = copy.copy(args)
    base_args.module = "torchhpc.bench.nodes"
    base_args.nodes = None
    base_args.name = args.name or "bench-nodes"
    base = spec_from_args(base_args, [])
    if getattr(args, "nproc_per_node", None) is None and getattr(args, "nproc_short", None) is None \
            and not base.gpus_per_node:
        base = base.with_(nproc_per_node=2)  # two ranks per node: the intra-node all_reduce needs a peer
    if args.launcher is None and base.scheduler in SRUN.schedulers:
        base = base.with_(launcher="srun")  # the quickest start: no torchrun agent importing torch per node
    scheduler = get_scheduler(base.scheduler)
    target = announce_target(scheduler, dry_run=args.dry_run)
    n, names, in_alloc = nodes_job.resolve_nodes(scheduler, args.nodes, args.nodelist)
    spec, json_path = nodes_job.make_spec(
        base, n, names, size=args.size, iters=args.iters, slow_ratio=args.slow_ratio, budget=args.budget,
        out_dir=args.out, deadline=started + args.budget - nodes_job.RESERVE_SECONDS, stat=args.stat)
    if args.dry_run:
        print(scheduler.render(spec))
        return 0
    run = nodes_job.run_job(scheduler, spec, json_path, budget=args.budget, started=started,
                            in_allocation=in_alloc, say=lambda t: print(t, flush=True))
    run.report["target"] = target  # --json says where it ran (a dev cluster, or null: the site's own)
    bad = nodes_job.write_outputs(run, args.json, args.exclude_file)
    print()
    print(plan.format_table(run.rows))
    print()
    print(nodes_job.summary(run, bad))
    if args.exclude_file:
        print(f"exclude list: {args.exclude_file} ({counted(len(bad), 'node')}); next job: torchhpc run --exclude @{args.exclude_file} ...")
    skipped = run.report.get("skipped_rounds") or []
    late = (f"the budget ran out: {counted(sum(len(r) for r in skipped), 'pair')} not measured "
            f"({', '.join(k for r in skipped for k in r)})") if skipped else ""
    if bad:
        raise JobFailed(f"SLOW or FAIL: {', '.join(bad)}" + (f"; {late}" if late else ""),
                        "drain it (scontrol update nodename=NODE state=drain reason=slow), keep it out with "
                        "--exclude, report it to the admins; docs/nodes.md explains the table")
    links = nodes_job.slow_links(run)
    if links:
        raise JobFailed(f"slow {plural(len(links), 'link')} between nodes that are fine otherwise: {', '.join(links)}" +
                        (f"; {late}" if late else ""),
                        "a route or switch port between them; run again to confirm, then report it with --json")
    if late:
        raise JobFailed(late, f"give a larger --budget than {args.budget:g}s")
    return 0
