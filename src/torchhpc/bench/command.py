"""The rank-side bench commands (collectives, ``run``, ``gpu``, ``explain``, ``report``) and their flags.

They live in the bench layer so that ``python -m torchhpc.bench all_reduce ...``,
which launchers start on every rank, needs no CLI module: ``torchhpc bench``
(cli/bench.py) adds the same subcommands plus ``sweep``, which submits jobs.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from torchhpc.bench.collectives import COLLECTIVES, DTYPES, OPS
from torchhpc.core.units import parse_size
from torchhpc.errors import JobFailed, TorchHPCError, UsageError

__all__ = ["add_bench_commands", "bench_flags", "config_from_args", "env_default", "main", "size_arg"]


def env_default(flag: str, default: Any = None, cast: type | None = None) -> Any:
    """Default for ``--some-flag`` from ``TORCHHPC_SOME_FLAG`` (command line > variable > default)."""
    name = "TORCHHPC_" + flag.lstrip("-").upper().replace("-", "_")
    if name in os.environ:
        return cast(os.environ[name]) if cast else os.environ[name]
    return default


def size_arg(text: str) -> int:
    try:
        return parse_size(text, "size")
    except UsageError as e:  # argparse turns this into "argument -b/--minbytes: ..." and exit 2
        raise argparse.ArgumentTypeError(f"{text!r} is not a size: write it like 8, 128K, 64M or 1G") from e


def bench_flags() -> argparse.ArgumentParser:
    """nccl-tests' flags, shared by every collective's subcommand (and `run`)."""
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("nccl-tests flags")
    g.add_argument("-t", "--collective", action="append", default=[], metavar="NAME[,NAME]",
                   help=f"collective(s) to run: {', '.join(COLLECTIVES)}")
    g.add_argument("-b", "--minbytes", type=size_arg, default=env_default("--minbytes", "32M"),
                   help="smallest size, e.g. 8, 128K, 1G (default 32M) [TORCHHPC_MINBYTES]")
    g.add_argument("-e", "--maxbytes", type=size_arg, default=env_default("--maxbytes", "32M"),
                   help="largest size (default 32M) [TORCHHPC_MAXBYTES]")
    g.add_argument("-f", "--stepfactor", type=float, default=1.0,
                   help="multiply the size by this between steps (default: off, use -i)")
    g.add_argument("-i", "--stepbytes", type=size_arg, default=1 << 20, help="add this many bytes between steps (default 1M)")
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


def add_bench_commands(bsub: Any) -> None:
    """The subcommands that run where they are started (one rank each, or a login node)."""
    flags = bench_flags()
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
    s.add_argument("--copy-bytes", type=size_arg, default=1 << 30, help="bytes per copy (default 1G)")
    s.add_argument("--json", default=None, metavar="FILE", help="write the figures as JSON")
    s.set_defaults(func=cmd_gpu)

    s = bsub.add_parser("report", help="rebuild the Markdown table and PNG from saved JSON")
    s.add_argument("paths", nargs="+", metavar="DIR|FILE", help="bench JSON files or folders holding them")
    s.add_argument("-o", "--out", default=None, help="folder for report.md and busbw.png (default: the first DIR)")
    s.add_argument("-t", "--collective", default=None, help="only this collective")
    s.set_defaults(func=cmd_report)


def config_from_args(args: argparse.Namespace) -> Any:
    from torchhpc.bench.config import BenchConfig

    names = ([args.first] if args.first else []) + list(args.collective)
    return BenchConfig(
        collectives=tuple(names or ["all_reduce"]),
        minbytes=args.minbytes if isinstance(args.minbytes, int) else size_arg(args.minbytes),
        maxbytes=args.maxbytes if isinstance(args.maxbytes, int) else size_arg(args.maxbytes),
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
        from torchhpc.core.plot import check_available

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
    print(f"\nReport: {md}" + (f"\nPlot:   {png}" if png else ""))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m torchhpc.bench WHAT ...``: the same as ``torchhpc bench WHAT ...`` (no ``sweep``)."""
    parser = argparse.ArgumentParser(
        prog="python -m torchhpc.bench",
        description="nccl-tests in Python, this process one rank: start it under a launcher, e.g. "
                    "`torchhpc run -n 2 -m torchhpc.bench all_reduce -b 1K -e 64M` (`torchhpc bench --help`: all)",
    )
    add_bench_commands(parser.add_subparsers(dest="bench_command", metavar="WHAT"))
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except TorchHPCError as e:  # as the torchhpc command reports it
        print(f"Error: {e.message}" + (f"\nHINT: {e.hint}" if e.hint else ""), file=sys.stderr)
        return e.exit_code
