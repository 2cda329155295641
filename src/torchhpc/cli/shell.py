"""``torchhpc shell``: an interactive allocation (the seeds' ``salloc`` workflow)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from torchhpc.cli.common import add_subparser, announce_target
from torchhpc.cli.jobargs import add_job_arguments, spec_from_args
from torchhpc.core.shell import join
from torchhpc.errors import UsageError
from torchhpc.schedulers import get_scheduler


def register(sub: Any) -> None:
    p = add_subparser(sub, "shell", "start (or print, with --dry-run) an interactive shell on allocated nodes")
    add_job_arguments(p, program=False)
    p.add_argument("--dry-run", action="store_true", help="print the command; start nothing")
    p.set_defaults(func=cmd_shell)


# What a batch job has and an interactive allocation does not: given to `shell`, refused, never ignored.
_BATCH_ONLY = (
    ("--array", lambda s: s.array is not None, "an interactive shell is one allocation, not an array"),
    ("--requeue", lambda s: s.requeue, "an interactive allocation is not requeued"),
    ("--max-restarts", lambda s: s.max_restarts > 0, "nothing restarts an interactive shell"),
    ("--spares", lambda s: s.spares > 0, "spare nodes serve the in-allocation supervisor of a batch job"),
    ("--after-ok/--after-any/--after-fail", lambda s: bool(s.after), "salloc waits for nothing but nodes"),
    ("--signal-before", lambda s: bool(s.signal_before), "the stop signal is for a batch job's ranks"),
)


def _refuse_batch_only(spec: Any) -> None:
    for flag, used, why in _BATCH_ONLY:
        if used(spec):
            raise UsageError(f"{flag}: {why}", f"drop {flag.split('/')[0]} from `torchhpc shell`, or use `torchhpc run`")


def cmd_shell(args: argparse.Namespace) -> int:
    args.interactive_shell = True  # a profile's shell_optional requirements (mn5: time) may be left out
    spec = spec_from_args(args, ["bash"])
    _refuse_batch_only(spec)
    sched: Any = get_scheduler(spec.scheduler)
    if not sched.supports_interactive_shell:
        raise UsageError(f"the {spec.scheduler} scheduler has no interactive shell", "use --scheduler slurm")
    spec, notes = sched.supported(spec)  # the capability check every render runs (docs/capabilities.md)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    argv = sched.shell_argv(spec)
    announce_target(sched, dry_run=args.dry_run)
    if args.dry_run:
        print(join(argv))
        return 0
    env = getattr(sched.runner, "env", None)  # the target's SLURM_CONF (a dev cluster's), as run's commands get
    os.execvpe(argv[0], argv, {**os.environ, **env} if env else dict(os.environ))
    return 0  # not reached
