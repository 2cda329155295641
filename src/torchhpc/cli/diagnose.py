"""``torchhpc diagnose``: why a job failed, as a short verdict, then the evidence it came from."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from torchhpc.cli.common import add_subparser, print_json
from torchhpc.cli.handles import add_job_argument, require
from torchhpc.cli.remote import add_remote_arguments


def register(sub: Any) -> None:
    p = add_subparser(
        sub, "diagnose",
        "why a job failed: the class, the first rank that failed (host, own exit, error, file:line), the next step",
    )
    add_job_argument(p)
    p.add_argument("--json", action="store_true", help="the verdict as JSON")
    add_remote_arguments(p)
    p.set_defaults(func=cmd_diagnose)


def cmd_diagnose(args: argparse.Namespace) -> int:
    from torchhpc.diagnose.readback import diagnose_job

    sched, name, job = require(args, record_ok=True)  # an unknown job is an error, never "completed"
    from torchhpc.supervisor.show import attempt_lines, job_attempts

    verdict = diagnose_job(sched, name, job)
    tries = job_attempts(name, job, sched.end_dir(job))
    if args.json:
        print_json({**verdict.to_json(), "attempts": tries}, indent=2)
    else:
        sys.stdout.write(verdict.render())
        if tries:
            sys.stdout.write(f"attempts ({len(tries)}):\n" + "\n".join(attempt_lines(tries)) + "\n")
        if verdict.evidence:
            sys.stdout.write("evidence: " + "; ".join(verdict.evidence) + "\n")
    return 0 if verdict.ok else 1
