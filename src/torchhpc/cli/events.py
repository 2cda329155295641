"""``torchhpc events``: a job's timeline on the scheduler's clock, its account, and the ETTR line."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from torchhpc.cli.common import add_subparser, print_json
from torchhpc.cli.handles import add_job_argument, require


def register(sub: Any) -> None:
    p = add_subparser(
        sub, "events",
        "a job's timeline (queue, attempts, faults, restarts, end) and where its time went: ETTR, incidents, time lost",
    )
    add_job_argument(p)
    p.add_argument("--json", action="store_true", help="one object: events (time, kind, ...) and account")
    p.add_argument("--plot", metavar="FILE.png", help="draw each node's attempts and the faults (needs matplotlib)")
    p.set_defaults(func=cmd_events)


_PLOT_FORMATS = ("png", "pdf", "svg", "jpg", "jpeg", "eps", "ps", "tif", "tiff", "webp")


def _check_plot_path(path: str) -> None:
    """Refuse a --plot path that cannot be written before anything is read (never matplotlib's traceback)."""
    import os

    from torchhpc.errors import UsageError

    suffix = os.path.splitext(path)[1].lstrip(".").lower()
    if suffix not in _PLOT_FORMATS:
        raise UsageError(f"--plot {path}: {('.' + suffix) if suffix else 'no suffix'} is not an image format",
                         f"end the file name with one of: {', '.join('.' + f for f in _PLOT_FORMATS)} (e.g. {os.path.splitext(path)[0] or 'events'}.png)")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UsageError(f"--plot {path}: the directory {folder} does not exist", "create it first, or choose another path")
    if not os.access(folder, os.W_OK):
        raise UsageError(f"--plot {path}: the directory {folder} is not writable", "choose a directory you can write")


def cmd_events(args: argparse.Namespace) -> int:
    from torchhpc.diagnose.events import gather

    if args.plot:
        from torchhpc.core.plot import check_available

        check_available()
        _check_plot_path(args.plot)
    sched, name, job = require(args, record_ok=True)
    tl = gather(sched, name, job)
    if args.json:
        print_json(tl.to_json(), indent=2)
    else:
        sys.stdout.write(tl.render())
    if args.plot:
        from torchhpc.diagnose.events_plot import plot_timeline

        sys.stdout.flush()
        print(f"wrote {plot_timeline(tl, args.plot)}", file=sys.stderr)
    return 0
