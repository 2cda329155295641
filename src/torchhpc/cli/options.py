"""``torchhpc options SCHEDULER``: the typed ``--opt KEY=VALUE`` options of a scheduler."""

from __future__ import annotations

import argparse
import importlib
from typing import Any

from torchhpc.cli.common import add_subparser
from torchhpc.schedulers import REGISTRY


def register(sub: Any) -> None:
    p = add_subparser(sub, "options", "list the --opt KEY=VALUE options of a scheduler (name, type, default)")
    p.add_argument("scheduler", choices=list(REGISTRY))
    p.set_defaults(func=cmd_options)


def cmd_options(args: argparse.Namespace) -> int:
    from torchhpc.schedulers.options import options_table

    mod, cls = REGISTRY[args.scheduler].split(":")
    options = getattr(getattr(importlib.import_module(mod), cls), "OPTIONS", {})
    if not options:
        print(f"the {args.scheduler} scheduler takes no --opt options")
    for line in options_table(options.values()):
        print(line)
    return 0
