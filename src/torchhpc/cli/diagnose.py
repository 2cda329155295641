"""``torchhpc diagnose``: why a job failed, as a short verdict, then the evidence it came from."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from torchhpc.cli.common import add_subparser, env_default
from torchhpc.cli.remote import add_remote_arguments
from torchhpc.schedulers import get_scheduler, parse_handle


def register(sub: Any) -> None:
    p = add_subparser(
        sub, "diagnose",
        "why a job failed: the class, the first rank that failed (host, own exit, error, file:line), the next step",
    )
    p.add_argument("job", help="job handle, e.g. slurm:123 (a bare id uses --scheduler)")
    p.add_argument("-s", "--scheduler", default=env_default("--scheduler", "slurm"), help="scheduler for a bare id [TORCHHPC_SCHEDULER]")
    p.add_argument("--json", action="store_true", help="the verdict as JSON")
    add_remote_arguments(p)
    p.set_defaults(func=cmd_diagnose)


def cmd_diagnose(args: argparse.Namespace) -> int:
    from torchhpc.diagnose.verdict import diagnose, gather

    name, job = parse_handle(args.job, args.scheduler)
    from torchhpc.supervisor.show import attempt_lines, job_attempts

    sched = get_scheduler(name)
    verdict = diagnose(gather(sched, name, job))
    tries = job_attempts(name, job, sched.end_dir(job))
    if args.json:
        json.dump({**verdict.to_json(), "attempts": tries}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(verdict.render())
        if tries:
            sys.stdout.write(f"attempts ({len(tries)}, attempts.json):\n" + "\n".join(attempt_lines(tries)) + "\n")
        if verdict.evidence:
            sys.stdout.write("evidence: " + "; ".join(verdict.evidence) + "\n")
    return 0 if verdict.ok else 1
