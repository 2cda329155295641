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

from torchhpc.bench.collectives import COLLECTIVES, DTYPES, OPS
from torchhpc.cli.common import add_subparser, env_default
from torchhpc.core.units import parse_size
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


def _size(text: str) -> int:
    try:
        return parse_size(text, "size")
    except UsageError as e:  # argparse turns this into "argument -b/--minbytes: ..." and exit 2
        raise argparse.ArgumentTypeError(f"{text!r} is not a size: write it like 8, 128K, 64M or 1G") from e


def _env_size(flag: str, default: str) -> Any:
    """A size flag's default from ``TORCHHPC_*`` (argparse converts string defaults with ``type``)."""
    return env_default(flag, default)


def _flags() -> argparse.ArgumentParser:
    """nccl-tests' flags, shared by every collective's subcommand (and `run`)."""
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("nccl-tests flags")
    g.add_argument("-t", "--collective", action="append", default=[], metavar="NAME[,NAME]",
                   help=f"collective(s) to run: {', '.join(COLLECTIVES)}")
    g.add_argument("-b", "--minbytes", type=_size, default=_env_size("--minbytes", "32M"),
                   help="smallest size, e.g. 8, 128K, 1G (default 32M) [TORCHHPC_MINBYTES]")
    g.add_argument("-e", "--maxbytes", type=_size, default=_env_size("--maxbytes", "32M"),
                   help="largest size (default 32M) [TORCHHPC_MAXBYTES]")
    g.add_argument("-f", "--stepfactor", type=float, default=1.0,
                   help="multiply the size by this between steps (default: off, use -i)")
    g.add_argument("-i", "--stepbytes", type=_size, default=1 << 20, help="add this many bytes between steps (default 1M)")
    g.add_argument("-n", "--iters", type=int, default=env_default("--iters", 20, int),
                   help="timed calls per size (default 20) [TORCHHPC_ITERS]")
    g.add_argument("-w", "--warmup_iters", "--warmup-iters", dest="warmup", type=int, default=5,
                   help="untimed warm-up calls per size (default 5)")
    g.add_argument("-c", "--check", type=int, default=1, help="check results after timing: 1 yes (default), 0 no")
    g.add_argument("-d", "--datatype", default="float", help=f"element type: {', '.join(DTYPES)} (default float)")
    g.add_argument("-o", "--op", default="sum", choices=OPS, help="reduction (default sum; avg needs NCCL)")
    g.add_argument("-r", "--root", type=int, default=0, help="root rank of broadcast and reduce (default 0)")
    g.add_argument("-a", "--average", type=int, default=1, choices=(0, 1, 2, 3),
                   help="time over ranks: 0 rank 0, 1 average (default), 2 minimum, 3 maximum")
    o = p.add_argument_group("output")
    o.add_argument("--json", default=None, metavar="FILE", help="write the results as JSON (rank 0)")
    o.add_argument("--plot", default=None, metavar="FILE.png", help="plot busbw vs size (rank 0; needs matplotlib)")
    o.add_argument("--min-bw", type=float, default=env_default("--min-bw", None, float), metavar="GBPS",
                   help="fail (exit 1) when the average bus bandwidth is below GBPS GB/s [TORCHHPC_MIN_BW]")
    o.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                   help="auto: CUDA + NCCL when a GPU is visible, else CPU + gloo")
    return p


def register(sub: Any) -> None:
    p = add_subparser(sub, "bench", "collective benchmarks (nccl-tests semantics), GPU checks, sweeps, reports",
                      __doc__)
    p.epilog = EXAMPLES
    bsub = p.add_subparsers(dest="bench_command", metavar="WHAT")
    flags = _flags()
    for name, coll in COLLECTIVES.items():
        s = bsub.add_parser(name, parents=[flags], help=f"time {name}: {coll.describe}",
                            formatter_class=argparse.RawDescriptionHelpFormatter)
        s.set_defaults(func=cmd_run, first=name)
    s = bsub.add_parser("run", parents=[flags], help="time the collectives given with -t (default all_reduce)")
    s.set_defaults(func=cmd_run, first=None)

    s = bsub.add_parser("explain", help="what algbw, busbw, #wrong and the link limit mean")
    s.set_defaults(func=cmd_explain)

    s = bsub.add_parser("gpu", help="this node's GPU: matmul TFLOP/s, memory and host<->device bandwidth, LayerNorm")
    s.add_argument("--size", type=int, default=8192, help="matmul side N (N x N @ N x N; default 8192)")
    s.add_argument("--copy-bytes", type=_size, default=1 << 30, help="bytes per copy (default 1G)")
    s.add_argument("--json", default=None, metavar="FILE", help="write the figures as JSON")
    s.set_defaults(func=cmd_gpu)

    s = bsub.add_parser("report", help="rebuild the Markdown table and PNG from saved JSON")
    s.add_argument("paths", nargs="+", metavar="DIR|FILE", help="bench JSON files or folders holding them")
    s.add_argument("-o", "--out", default=None, help="folder for report.md and busbw.png (default: the first DIR)")
    s.add_argument("-t", "--collective", default=None, help="only this collective")
    s.set_defaults(func=cmd_report)

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
    s.add_argument("bench_args", nargs=argparse.REMAINDER, help="-- then bench flags for every job")
    s.set_defaults(func=cmd_sweep)

    _register_nodes(bsub)
    p.set_defaults(func=lambda _a: _help(p))


NODES_DESCRIPTION = """\
Find the slow node, GPU or link of an allocation in one job: per node a compute check (GPU matmul and
copy, CPU matmul and copy otherwise) and an all_reduce among the node's ranks, each against the median
node; then a ring of node pairs (2 rounds of pairs running at the same time; 3 for an odd count),
slow pairs measured again, and every node whose pairs are all slow confirmed against a known-good node.
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
    g.add_argument("-s", "--size", type=_size, default=_env_size("--size", "64M"),
                   help="bytes per pair all_reduce (default 64M) [TORCHHPC_SIZE]")
    g.add_argument("--iters", type=int, default=3, help="timed calls per pair and per node check (default 3)")
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


def _help(p: argparse.ArgumentParser) -> int:
    p.print_help()
    return 2


def config_from_args(args: argparse.Namespace) -> Any:
    from torchhpc.bench.config import BenchConfig

    names = ([args.first] if args.first else []) + list(args.collective)
    return BenchConfig(
        collectives=tuple(names or ["all_reduce"]),
        minbytes=args.minbytes if isinstance(args.minbytes, int) else _size(args.minbytes),
        maxbytes=args.maxbytes if isinstance(args.maxbytes, int) else _size(args.maxbytes),
        stepfactor=args.stepfactor,
        stepbytes=args.stepbytes,
        iters=args.iters,
        warmup=args.warmup,
        check=args.check,
        datatype=args.datatype,
        op=args.op,
        root=args.root,
        average=args.average,
        device=args.device,
        json=args.json,
        plot=args.plot,
        min_bw=args.min_bw,
    )


def _print(line: str) -> None:
    print(line, flush=True)


def cmd_run(args: argparse.Namespace) -> int:
    from torchhpc.bench import context, runner

    cfg = config_from_args(args)
    if cfg.plot:
        from torchhpc.bench.plot import check_available

        check_available()  # before the run, not after minutes of it
    ctx = context.init(cfg.device)
    try:
        result = runner.run(cfg, ctx, emit=_print)
    finally:
        context.cleanup(ctx)
    failures = result.failures(cfg.min_bw)
    if not ctx.is_main:
        # The verdict is rank 0's to give (it prints why and exits non-zero): another rank
        # exiting 1 first would make a fail-fast launcher kill rank 0 before it writes its files.
        return 0
    if cfg.json:
        result.save(cfg.json)
        _print(f"# JSON written to {cfg.json}")
    if cfg.plot:
        from torchhpc.bench.plot import plot_results

        plot_results([result], cfg.plot)
        _print(f"# Plot written to {cfg.plot}")
    if failures:
        raise JobFailed(
            "benchmark failed: " + "; ".join(failures),
            "wrong values mean a broken collective (driver, memory, network): rerun with NCCL_DEBUG=INFO; "
            "low bandwidth: see `torchhpc bench explain` for the link limit",
        )
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    from torchhpc.bench.explain import explain_text

    sys.stdout.write(explain_text())
    return 0


def cmd_gpu(args: argparse.Namespace) -> int:
    from torchhpc.bench.gpu import gpu_check

    return gpu_check(matmul_n=args.size, copy_bytes=args.copy_bytes, json_path=args.json, emit=_print)


def cmd_report(args: argparse.Namespace) -> int:
    from torchhpc.bench.sweep import write_report

    md, png = write_report(args.paths, args.out, collective=args.collective)
    with open(md) as fh:
        sys.stdout.write(fh.read())
    print(f"\nReport: {md}\nPlot:   {png}")
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from torchhpc.bench.sweep import parse_nodes, plan, run_sweep, write_report
    from torchhpc.cli.common import Progress
    from torchhpc.cli.jobargs import spec_from_args
    from torchhpc.schedulers import get_scheduler

    rest = list(args.bench_args)
    if rest and rest[0] == "--":
        rest = rest[1:]
    # Check the bench flags here, not minutes later in the first job's log.
    check = argparse.ArgumentParser(prog="torchhpc bench sweep -- ", parents=[_flags()], add_help=False)
    bench = check.parse_args(rest)
    config_from_args(argparse.Namespace(**vars(bench), first=args.sweep_collective))
    nodes = parse_nodes(args.nodes)
    base_args = copy.copy(args)
    base_args.nodes = 1
    base_args.module = "torchhpc.bench"
    if base_args.name is None:
        base_args.name = "bench-" + args.sweep_collective.replace(",", "-")
    base = spec_from_args(base_args, [])
    if base.scheduler == "local" and max(nodes) > 1:
        raise UsageError(f"--nodes {args.nodes} with the local scheduler (one machine)",
                         "give --scheduler slurm (or pbs, kubernetes) for a sweep over node counts")
    jobs = plan(base, nodes, args.sweep_collective, rest, args.out)
    scheduler = get_scheduler(base.scheduler)
    progress = Progress()
    failed = run_sweep(jobs, scheduler, timeout=args.timeout, progress=progress.update)
    progress.done()
    done = [j.json_path for j in jobs if os.path.exists(j.json_path)]
    if done:
        md, png = write_report(done, args.out, collective=None)
        with open(md) as fh:
            sys.stdout.write(fh.read())
        print(f"\nReport: {md}\nPlot:   {png}")
    if failed:
        hint = f"their logs are in {args.out}; `torchhpc logs SCHEDULER:JOBID` shows one"
        if base.container is not None:
            hint += ("; in a container the image's python must import torchhpc (install it in the image, "
                     "or --bind a checkout and --env PYTHONPATH=CHECKOUT/src) and --out must be bound in")
        raise JobFailed(f"{len(failed)} sweep job(s) failed: " + "; ".join(failed), hint)
    return 0


def cmd_nodes(args: argparse.Namespace) -> int:
    import time

    from torchhpc.bench import nodes_job
    from torchhpc.bench import nodes_plan as plan
    from torchhpc.cli.jobargs import spec_from_args
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
    if args.launcher is None and base.scheduler == "slurm":
        base = base.with_(launcher="srun")  # the quickest start: no torchrun agent importing torch per node
    scheduler = get_scheduler(base.scheduler)
    n, names, in_alloc = nodes_job.resolve_nodes(scheduler, args.nodes, args.nodelist)
    spec, json_path = nodes_job.make_spec(
        base, n, names, size=args.size, iters=args.iters, slow_ratio=args.slow_ratio, budget=args.budget,
        out_dir=args.out, deadline=started + args.budget - nodes_job.RESERVE_SECONDS, stat=args.stat)
    if args.dry_run:
        print(scheduler.render(spec))
        return 0
    run = nodes_job.run_job(scheduler, spec, json_path, budget=args.budget, started=started,
                            in_allocation=in_alloc, say=lambda t: print(t, flush=True))
    bad = nodes_job.write_outputs(run, args.json, args.exclude_file)
    print()
    print(plan.format_table(run.rows))
    print()
    print(nodes_job.summary(run, bad))
    if args.exclude_file:
        print(f"exclude list: {args.exclude_file} ({len(bad)} node(s)); next job: torchhpc run --exclude @{args.exclude_file} ...")
    skipped = run.report.get("skipped_rounds") or []
    late = (f"the budget ran out: {sum(len(r) for r in skipped)} pair(s) not measured "
            f"({', '.join(k for r in skipped for k in r)})") if skipped else ""
    if bad:
        raise JobFailed(f"SLOW or FAIL: {', '.join(bad)}" + (f"; {late}" if late else ""),
                        "drain it (scontrol update nodename=NODE state=drain reason=slow), keep it out with "
                        "--exclude, report it to the admins; docs/nodes.md explains the table")
    if late:
        raise JobFailed(late, f"give a larger --budget than {args.budget:g}s")
    return 0
