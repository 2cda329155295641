"""``torchhpc sweep``: a grid of parameters as one array job; ``sweep status|report DIR``."""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from typing import Any

from torchhpc.cli.common import add_subparser, eprint, print_json
from torchhpc.cli.jobargs import add_job_arguments, spec_from_args, split_program
from torchhpc.cli.remote import add_remote_arguments
from torchhpc.core.handle import Handle

DESCRIPTION = """Run a grid of parameters as ONE array job (Slurm --array, PBS -J/-t, local %K at a time).

Each --grid NAME=V1,V2 multiplies the tasks; task i runs the program with {NAME} replaced by
its value (and {index} by i) in its own arguments, exactly. The manifest (task index ->
parameters) is written to the output directory as sweep.json; `torchhpc sweep status DIR`
and `torchhpc sweep report DIR` show one row per task (state, exit code, restarts, elapsed,
the task's last `RESULT {json}` line); report writes report.md, report.csv and report.png.
"""

EXAMPLES = """examples:
  torchhpc sweep --scheduler slurm --nodes 2 --launcher srun --grid lr=0.5,1.0 --grid seed=1,2 \\
      --array-parallelism 2 -- examples/mnist_ddp.py --epochs 1 --lr {lr} --seed {seed}
  torchhpc sweep status mnist_ddp-sweep-20261123-193000
  torchhpc sweep report mnist_ddp-sweep-20261123-193000 --metric accuracy --param lr
"""


def register(sub: Any) -> None:
    p = add_subparser(sub, "sweep", "run a grid of parameters as one array job; status and report per task", DESCRIPTION)
    p.epilog = EXAMPLES
    add_job_arguments(p)
    p.add_argument("--grid", action="append", default=[], metavar="NAME=V1,V2",
                   help="a parameter and its values (repeatable: the tasks are every combination); "
                        "values with commas as a JSON list: NAME='[\"a,b\", \"c\"]'")
    p.add_argument("--array-parallelism", "--parallel", type=int, default=None, metavar="K",
                   help="at most K tasks at once (Slurm %%K)")
    p.add_argument("--dry-run", action="store_true", help="print the rendered array job and the manifest; submit nothing")
    p.add_argument("--wait", action="store_true", help="wait for every task, then print the report")
    actions = p.add_subparsers(dest="sweep_action", metavar="ACTION")
    s = actions.add_parser("status", help="one row per task of the sweep in DIR")
    s.add_argument("directory", metavar="DIR")
    s.add_argument("--json", action="store_true", help="rows as JSON")
    s.set_defaults(func=cmd_status)
    r = actions.add_parser("report", help="write DIR/report.md, report.csv and report.png (one metric vs one parameter)")
    r.add_argument("directory", metavar="DIR")
    r.add_argument("--metric", default=None, help="RESULT field to plot (default: accuracy, else the first number)")
    r.add_argument("--param", default=None, help="parameter on the x axis (default: the first --grid)")
    r.set_defaults(func=cmd_report)
    add_remote_arguments(p, ship=True)
    p.set_defaults(func=cmd_sweep, _parser=p)


def cmd_sweep(args: argparse.Namespace) -> int:
    head, program = split_program(args._parser, args._argv)
    args = args._parser.parse_args(head)
    from torchhpc.cli.follow import follow
    from torchhpc.schedulers import get_scheduler
    from torchhpc.sweep import (
        check_manifest_free,
        free_directory,
        manifest,
        parse_grid,
        sweep_spec,
        write_manifest,
    )

    if getattr(args, "array", None):
        from torchhpc.errors import UsageError

        raise UsageError(f"--array {args.array}: a sweep makes its array from --grid (one task per combination)",
                         "drop --array; --array-parallelism K runs at most K tasks at once")
    grid = parse_grid(args.grid)
    if args.output_dir is None and program:
        stem = re.sub(r"[^A-Za-z0-9._-]", "_", os.path.splitext(os.path.basename(program[0]))[0]) or "sweep"
        args.output_dir = free_directory(f"{stem}-sweep-{time.strftime('%Y%m%d-%H%M%S')}")
    spec = sweep_spec(spec_from_args(args, program), grid, args.array_parallelism)
    scheduler = get_scheduler(spec.scheduler)
    submission = scheduler.render(spec)
    man = manifest(spec)
    if args.dry_run:
        sys.stdout.write(str(submission))
        print(f"# --- manifest ({os.path.join(os.path.abspath(spec.output_dir), 'sweep.json')}) ---")
        print_json(man["tasks"])
        return 0
    from torchhpc.job import check_program

    check_program(spec)
    check_manifest_free(spec.output_dir)
    job_id = scheduler.start(submission)
    handle = str(Handle(spec.scheduler, job_id))
    directory = os.path.abspath(spec.output_dir)
    write_manifest(directory, {**man, "job_id": job_id, "handle": handle})
    print(f"Submitted {handle}: {len(man['tasks'])} tasks ({spec.array}), manifest {directory}/sweep.json")
    if not args.wait:
        print(f"Follow it with: torchhpc wait {handle}; torchhpc sweep status {directory}")
        return 0
    code = follow(scheduler, job_id, print_logs=False)
    _print_rows(directory)
    return code


def _print_rows(directory: str) -> None:
    from torchhpc.sweep import markdown, task_rows

    sys.stdout.write(markdown(task_rows(directory)))


def cmd_status(args: argparse.Namespace) -> int:
    from torchhpc.sweep import task_rows

    if args.json:
        print_json(task_rows(args.directory))
    else:
        _print_rows(args.directory)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from torchhpc.sweep import report

    paths = report(args.directory, metric=args.metric, param=args.param)
    with open(paths["md"]) as f:
        sys.stdout.write(f.read())
    if "png" not in paths:  # say why, as seen: no metric found, or no matplotlib
        from torchhpc.sweep import no_png_reason, task_rows

        why = no_png_reason(task_rows(args.directory), args.metric)
    eprint("wrote " + ", ".join(paths.values()) + ("" if "png" in paths else f" (no PNG: {why})"))
    return 0
