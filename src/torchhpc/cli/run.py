"""``torchhpc run``: render a job for a scheduler, then run or submit it.

parse -> :func:`spec_from_args` (typed JobSpec) -> ``scheduler.render`` ->
print (``--dry-run``) or ``schedule``. The local scheduler runs in the
foreground like torchrun; the others submit and, with ``--wait``, follow the
job to its end and print its log.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from torchhpc.cli.common import Progress, add_subparser, eprint
from torchhpc.cli.jobargs import add_job_arguments, spec_from_args, split_program
from torchhpc.env.compat import preflight
from torchhpc.schedulers import get_scheduler
from torchhpc.schedulers.api import JobStatus, Scheduler

DESCRIPTION = """Run or submit a distributed job.

The local scheduler (the default) runs the ranks here in the foreground, like torchrun;
slurm, pbs, kubernetes and runai submit the job and print its handle (--wait follows it
to its end and prints its log). --dry-run prints exactly what would run or be submitted.
"""

EXAMPLES = """examples:
  torchhpc run -n 4 examples/pi.py                      4 local ranks (the default scheduler)
  torchhpc run -n 3 -- python -c 'print(1)'            any command, after --
  torchhpc run -n 2 -m torchhpc.bench all_reduce -b 1K -e 64M
  torchhpc run --scheduler slurm --nodes 2 --nproc-per-node 2 --launcher srun examples/pi.py --wait
  torchhpc run --scheduler slurm --nodes 2 --gpus-per-node 4 --dry-run train.py --epochs 3

Flags go before the program; --wait, --dry-run and --rank0-only may also follow it.
Everything else after the program (or after --) is passed to it unchanged.
"""


def register(sub: Any) -> None:
    p = add_subparser(sub, "run", "run or submit a distributed job", DESCRIPTION)
    p.epilog = EXAMPLES
    add_job_arguments(p)
    p.add_argument("--dry-run", action="store_true", help="print what would run or be submitted; touch nothing")
    p.add_argument("--wait", action="store_true", help="wait for a submitted job to end and print its log")
    p.add_argument("--rank0-only", action="store_true", help="local: show only rank 0's output")
    p.set_defaults(func=cmd_run, _parser=p)


def parse_run(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    head, program = split_program(parser, argv)
    return parser.parse_args(head), program


def cmd_run(args: argparse.Namespace) -> int:
    # argparse saw the whole line as one blob (REMAINDER); re-split it our way.
    args, program = parse_run(args._parser, args._argv)
    spec = spec_from_args(args, program)
    # Before anything renders: a script reading variables this launcher never sets is refused (docs/compat.md).
    for warning in preflight(spec):
        eprint(f"Warning: {warning}")
    scheduler = get_scheduler(spec.scheduler)
    submission = scheduler.render(spec)
    if args.dry_run:
        sys.stdout.write(str(submission))
        return 0
    if spec.scheduler == "local":
        run_local: Any = scheduler
        return int(run_local.run(submission, rank0_only=args.rank0_only))
    job_id = scheduler.schedule(submission)
    handle = f"{spec.scheduler}:{job_id}"
    print(f"Submitted {handle} ({spec.name}: {spec.nodes} node(s) x {spec.nproc_per_node} rank(s), {spec.launcher})")
    if not args.wait:
        print(f"Follow it with: torchhpc wait {handle}; torchhpc logs {handle}")
        return 0
    return follow(scheduler, job_id)


def follow(scheduler: Scheduler, job_id: str, timeout: float | None = None, print_logs: bool = True) -> int:
    """Wait with progress, print the log, exit non-zero when the job failed."""
    progress = Progress()

    def show(st: JobStatus, elapsed: float) -> None:
        reason = f" ({st.reason})" if st.reason and st.reason not in ("None", "(null)") else ""
        progress.update(f"{scheduler.name}:{job_id} {st.state}{reason} elapsed {elapsed:.0f}s")

    st = scheduler.wait(job_id, poll=1.0, timeout=timeout, progress=show)
    progress.done()
    if print_logs:
        try:
            text = scheduler.logs(job_id)
        except Exception as e:  # logs are a courtesy here; the state is the answer
            text = ""
            eprint(f"(no log: {e})")
        if text:
            sys.stdout.write(text if text.endswith("\n") else text + "\n")
    eprint(f"{scheduler.name}:{job_id} {st.line()}")
    if st.ok:
        return 0
    code = st.exit_code if st.exit_code and 0 < st.exit_code < 256 else 1
    eprint(f"Error: job {job_id} ended {st.state}" + (f" with exit code {st.exit_code}" if st.exit_code else ""))
    return code
