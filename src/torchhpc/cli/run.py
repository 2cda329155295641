"""``torchhpc run``: render a job for a scheduler, then run or submit it.

parse -> :func:`spec_from_args` (typed JobSpec) -> ``scheduler.render`` ->
print (``--dry-run``) or ``schedule``. The local scheduler runs in the
foreground like torchrun; the others submit and, with ``--wait``, follow the
job to its end and print its log.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from torchhpc.cli.common import add_hang_arguments, add_subparser, announce_target, eprint, json_errors
from torchhpc.cli.follow import check_on_hang, follow, interruptible, status_dict, task_index  # noqa: F401 (task_index: re-exported)
from torchhpc.cli.jobargs import add_job_arguments, misplaced_flags, spec_from_args, split_program
from torchhpc.cli.remote import add_remote_arguments
from torchhpc.core.exitcodes import help_table
from torchhpc.core.handle import Handle
from torchhpc.core.script_reads import preflight
from torchhpc.core.units import counted
from torchhpc.errors import UsageError
from torchhpc.jobdir.record import read_record
from torchhpc.schedulers import get_scheduler
from torchhpc.schedulers.api import Submission

DESCRIPTION = """Run or submit a distributed job.

The local scheduler (the default) runs the ranks here in the foreground, like torchrun;
slurm, pbs, kubernetes and runai submit the job and print its handle (--wait follows it
to its end and prints its log). --dry-run prints exactly what would run or be submitted.

Every value comes from, first found: the command line, its TORCHHPC_* variable, the profile,
~/.config/torchhpc/config.toml, the built-in default (`torchhpc config show` lists them).
"""

EXAMPLES = """examples:
  torchhpc run -n 4 examples/pi.py                      4 local ranks (the default scheduler)
  torchhpc run -n 3 -- python3 -c 'print(1)'           any command, after --
  torchhpc run -n 2 -m torchhpc.bench all_reduce -b 1K -e 64M
  torchhpc run --scheduler slurm --nodes 2 --nproc-per-node 2 --launcher srun examples/pi.py --wait
  torchhpc run --scheduler slurm --nodes 2 --gpus-per-node 4 --dry-run train.py --epochs 3

Flags go before the program; --wait, --dry-run and --rank0-only may also follow it.
Everything else after the program (or after --) is passed to it unchanged.
"""


def register(sub: Any) -> None:
    p = add_subparser(sub, "run", "run or submit a distributed job", DESCRIPTION)
    p.epilog = EXAMPLES + "\n"
    p.epilog_more = help_table  # type: ignore[attr-defined]
    p.short_usage = "usage: torchhpc run [FLAGS] PROGRAM [ARGS...]  (or -m MODULE [ARGS...], or -- COMMAND...)"  # type: ignore[attr-defined]
    add_job_arguments(p)
    p.add_argument("--dry-run", action="store_true", help="print what would run or be submitted; touch nothing")
    p.add_argument("--wait", action="store_true", help="wait for a submitted job to end and print its log")
    add_hang_arguments(p)
    p.add_argument("--rank0-only", action="store_true", help="local: show only rank 0's output")
    p.add_argument("--background", action="store_true",
                   help="local: start the job in the background and print its handle (status, logs, cancel, wait)")
    p.add_argument("--json", action="store_true",
                   help="machine-readable output: the rendered submission (--dry-run), the handle, errors")
    add_remote_arguments(p, ship=True)
    p.set_defaults(func=cmd_run, _parser=p)


def cmd_run(args: argparse.Namespace) -> int:
    # argparse saw the whole line as one blob (REMAINDER); re-split it our way.
    parser, argv = args._parser, args._argv
    head, program = split_program(parser, argv)
    args = parser.parse_args(head)
    stray = misplaced_flags(parser, argv, program)
    if stray:
        verb = "goes" if len(stray) == 1 else "go"
        eprint(f"Warning: {' '.join(stray)} after {program[0]} {verb} to the program, not to torchhpc "
               "(put torchhpc's flags before the program; only --wait, --dry-run, --rank0-only may follow it)")
    return _run(args, program)


@json_errors
def _run(args: argparse.Namespace, program: list[str]) -> int:
    from torchhpc.job import check_gpus, check_program, no_gpu_warning

    spec = spec_from_args(args, program)
    # Before anything renders: a script reading variables this launcher never sets is refused (docs/compat.md).
    for warning in preflight(spec):
        eprint(f"Warning: {warning}")
    scheduler = get_scheduler(spec.scheduler)
    if args.rank0_only and not scheduler.runs_here:  # a capability of the local run (docs/capabilities.md)
        raise UsageError(
            f"--rank0-only: the {spec.scheduler} scheduler's ranks print to the job's log, not here",
            f"drop --rank0-only; `torchhpc logs {spec.scheduler}:ID --rank 0` shows rank 0's output",
        )
    if getattr(args, "background", False) and not scheduler.runs_here:  # documented local-only: never ignored
        raise UsageError(f"--background: a {spec.scheduler} job runs in the background already; the flag is the "
                         "local scheduler's", f"drop --background; `torchhpc wait {spec.scheduler}:ID` follows the job")
    if args.rank0_only and getattr(args, "background", False):
        raise UsageError("--rank0-only with --background: a background job's ranks print to its log, not here",
                         "drop --rank0-only; `torchhpc logs local:ID --rank 0` shows rank 0's output")
    if args.hang_timeout:
        check_on_hang(scheduler, args.on_hang)  # requeue where the scheduler cannot: refused
    if args.hang_timeout or spec.hang_timeout:  # the hang watch's module only for a job that has one
        from torchhpc.diagnose.hang import pg_timeout_note

        note = pg_timeout_note(args.hang_timeout or spec.hang_timeout, spec.gpus_per_node)
        if note:
            eprint(f"Note: {note}")
    if args.hang_timeout and args.on_hang != "cancel" and scheduler.watches_hangs(spec):
        raise UsageError(
            f"--on-hang {args.on_hang}: this job watches itself for hangs and restarts a hung run by policy "
            "(--max-restarts), with no client to requeue it",
            "drop --on-hang (a Slurm job requeues itself with --requeue when no node is left), or drop "
            "--max-restarts/--spares to have `wait --hang-timeout` watch it",
        )
    if args.dry_run and scheduler.runs_here:
        check_program(spec)  # here, a dry run shows what would run: never a program the run would refuse
    submission = scheduler.render(spec)
    if args.dry_run:
        target = announce_target(scheduler, dry_run=True)  # in the JSON only: a dry run touches no cluster
        if args.json:
            print(json.dumps({**_submission_dict(submission), "target": target}, indent=1))
        else:
            sys.stdout.write(str(submission))
        return 0
    check_program(spec)
    target = announce_target(scheduler)  # before the first Slurm command (check_gpus asks sinfo)
    check_gpus(spec, scheduler.runner)
    if scheduler.runs_here:
        gpu_warning = no_gpu_warning(spec)
        if gpu_warning:
            eprint(gpu_warning)
        if not args.background:
            if args.json:
                raise UsageError("--json with a local run needs --background", "a foreground run prints its ranks' output")
            from torchhpc.cli.foreground import run_foreground

            return run_foreground(scheduler, submission, rank0_only=args.rank0_only,
                                  hang_timeout=args.hang_timeout, on_hang=args.on_hang)
    job_id = scheduler.start(submission)
    handle = str(Handle(spec.scheduler, job_id))
    if args.json and not args.wait:
        print(json.dumps({"handle": handle, "scheduler": spec.scheduler, "job_id": job_id, "name": spec.name,
                          "nodes": spec.nodes, "nproc_per_node": spec.nproc_per_node, "launcher": spec.launcher,
                          "target": target}))
        return 0
    print(f"Submitted {handle} ({spec.name}: {counted(spec.nodes, 'node')} x {counted(spec.nproc_per_node, 'rank')}, {spec.launcher})",
          file=sys.stderr if args.json else sys.stdout)
    where = read_record(spec.scheduler, job_id).job_dir
    if where:
        print(f"Job directory: {where}/ (script, scheduler output, ranks/)", file=sys.stderr if args.json else sys.stdout)
    # Where the job does not watch itself for hangs, `wait --hang-timeout` does, from here.
    outside = None if scheduler.watches_hangs(spec) else args.hang_timeout
    if args.hang_timeout and not outside:
        print(f"Hang watch: in the job itself (--hang-timeout {args.hang_timeout:g}), no client needed",
              file=sys.stderr if args.json else sys.stdout)
    if not args.wait:
        watch = f" --hang-timeout {outside:g}" if outside else ""
        print(f"Follow it with: torchhpc wait {handle}{watch}; torchhpc logs {handle}")
        return 0
    if args.json:
        code = follow(scheduler, job_id, print_logs=False)

        print(json.dumps({**status_dict(spec.scheduler, scheduler.status(job_id)), "target": target}))
        return code
    return interruptible(spec.scheduler, job_id, lambda: follow(scheduler, job_id, hang_timeout=outside,
                                                                on_hang=args.on_hang))


def _submission_dict(sub: Submission) -> dict[str, Any]:
    return {
        "scheduler": sub.scheduler, "argv": list(sub.argv), "script": sub.script, "script_path": sub.script_path,
        "files": dict(sub.files), "notes": list(sub.notes),
    }
