"""``torchhpc logs``: print a job's output (all ranks, or one)."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from torchhpc.cli.common import add_subparser, env_default
from torchhpc.schedulers import get_scheduler, parse_handle


def register(sub: Any) -> None:
    p = add_subparser(sub, "logs", "print a job's output (all ranks, or one)")
    p.add_argument("job", help="job handle, e.g. slurm:123 (a bare id uses --scheduler)")
    p.add_argument("-s", "--scheduler", default=env_default("--scheduler", "slurm"), help="scheduler for a bare id [TORCHHPC_SCHEDULER]")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing until the job ends")
    p.add_argument("--rank", type=int, default=None, help="only this rank's lines")
    p.set_defaults(func=cmd_logs)


def cmd_logs(args: argparse.Namespace) -> int:
    name, job = parse_handle(args.job, args.scheduler)
    sched = get_scheduler(name)
    if not args.follow:
        sys.stdout.write(sched.logs(job, rank=args.rank))
        return 0
    printed = 0
    while True:
        text = sched.logs(job, rank=args.rank)
        sys.stdout.write(text[printed:])
        sys.stdout.flush()
        printed = len(text)
        if sched.status(job).terminal:
            text = sched.logs(job, rank=args.rank)
            sys.stdout.write(text[printed:])
            return 0
        time.sleep(1.0)
