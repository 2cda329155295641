"""``torchhpc diagnose``: why a job failed, as a short verdict, then the evidence it came from."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from torchhpc.cli.common import add_subparser
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
    from torchhpc.diagnose.verdict import diagnose, gather

    sched, name, job, _st = require(args, record_ok=True)  # an unknown job is an error, never "completed"
    from torchhpc.supervisor.show import attempt_lines, job_attempts

    verdict = diagnose(gather(sched, name, job))
    tries = job_attempts(name, job, sched.end_dir(job))
    if args.json:
        json.dump({**verdict.to_json(), "attempts": tries}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(verdict.render())
        if tries:
            sys.stdout.write(f"attempts ({len(tries)}):\n" + "\n".join(attempt_lines(tries)) + "\n")
        if verdict.evidence:
            sys.stdout.write("evidence: " + "; ".join(verdict.evidence) + "\n")
    return 0 if verdict.ok else 1
