"""``torchhpc options SCHEDULER``: the scheduler options ``--opt KEY=VALUE`` accepts."""

from __future__ import annotations

import argparse
import importlib
from typing import Any

from torchhpc.cli.common import add_subparser
from torchhpc.schedulers import REGISTRY


def register(sub: Any) -> None:
    p = add_subparser(sub, "options", "list the --opt KEY=VALUE options of a scheduler")
    p.add_argument("scheduler", choices=list(REGISTRY))
    p.set_defaults(func=cmd_options)


def cmd_options(args: argparse.Namespace) -> int:
    mod, cls = REGISTRY[args.scheduler].split(":")
    options: dict[str, str] = getattr(getattr(importlib.import_module(mod), cls), "OPTIONS", {})
    if not options:
        print(f"the {args.scheduler} scheduler takes no --opt options")
    width = max((len(k) for k in options), default=0)
    for key, help in options.items():
        print(f"  {key:<{width}}  {help}")
    return 0
