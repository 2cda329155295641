"""``torchhpc status|cancel|wait|list``: follow jobs by handle (``slurm:123`` or a bare id)."""

from __future__ import annotations

import argparse
from typing import Any

from torchhpc.cli.common import add_subparser, env_default
from torchhpc.schedulers import get_scheduler, parse_handle


def _handle_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("job", help="job handle, e.g. slurm:123 (a bare id uses --scheduler)")
    p.add_argument("-s", "--scheduler", default=env_default("--scheduler", "slurm"), help="scheduler for a bare id [TORCHHPC_SCHEDULER]")


def register(sub: Any) -> None:
    p = add_subparser(sub, "status", "show a job's state, exit code, reason and restarts")
    _handle_arg(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_status)

    p = add_subparser(sub, "cancel", "cancel a job")
    _handle_arg(p)
    p.set_defaults(func=cmd_cancel)

    p = add_subparser(sub, "wait", "wait for a job to end, showing progress; exit non-zero if it failed")
    _handle_arg(p)
    p.add_argument("--timeout", type=float, default=None, help="give up after this many seconds")
    p.add_argument("--logs", action="store_true", help="print the job's log at the end")
    p.set_defaults(func=cmd_wait)

    p = add_subparser(sub, "list", "list your queued and running jobs")
    p.add_argument("-s", "--scheduler", default=env_default("--scheduler", "slurm"))
    p.set_defaults(func=cmd_list)


def cmd_status(args: argparse.Namespace) -> int:
    name, job = parse_handle(args.job, args.scheduler)
    st = get_scheduler(name).status(job)
    if args.json:
        import json

        print(json.dumps({k: v for k, v in vars(st).items() if k != "raw"}))
    else:
        print(f"{name}:{st.line()}")
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    name, job = parse_handle(args.job, args.scheduler)
    get_scheduler(name).cancel(job)
    print(f"Cancelled {name}:{job}")
    return 0


def cmd_wait(args: argparse.Namespace) -> int:
    from torchhpc.cli.run import follow

    name, job = parse_handle(args.job, args.scheduler)
    return follow(get_scheduler(name), job, timeout=args.timeout, print_logs=args.logs)


def cmd_list(args: argparse.Namespace) -> int:
    for st in get_scheduler(args.scheduler).list_jobs():
        print(f"{args.scheduler}:{st.line()} name={st.name}")
    return 0
