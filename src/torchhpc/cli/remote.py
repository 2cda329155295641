"""``--remote`` on any subcommand: take it off the line and forward the rest (:mod:`torchhpc.remote`).

Not a subcommand of its own: :func:`intercept` runs before the line is parsed,
so a subcommand this version does not know (or one another helper adds) is
forwarded all the same, and only ``--help`` stays here.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from typing import Any

from torchhpc.errors import UsageError

__all__ = ["add_remote_arguments", "intercept"]

REMOTE_HELP = ("run this command on HOST's torchhpc over ssh (your ~/.ssh/config applies; "
               "$TORCHHPC_SSH_CONFIG adds a file); docs/remote.md [TORCHHPC_REMOTE]")


def add_remote_arguments(p: argparse.ArgumentParser, ship: bool = False) -> None:
    g = p.add_argument_group("remote (over ssh; docs/remote.md)")
    g.add_argument("--remote", metavar="[USER@]HOST", default=None, help=REMOTE_HELP)
    if ship:
        g.add_argument("--ship", choices=("worktree", "committed"), default=None,
                       help="what code --remote ships: worktree (HEAD + uncommitted changes, default) or committed "
                            "(HEAD only; refuses a dirty checkout)")
        g.add_argument("--ship-limit", metavar="SIZE", default=None,
                       help="refuse to ship more than SIZE (default 50M; .torchhpcignore keeps data out) "
                            "[TORCHHPC_SHIP_LIMIT]")


def _prefix(argv: Sequence[str], head: Sequence[str]) -> int:
    """How many words after the command are torchhpc's own flags before the program."""
    n = 0
    while n < len(head) and 1 + n < len(argv) and argv[1 + n] == head[n]:
        n += 1
    return n


def intercept(argv: list[str], build_parser: Callable[..., argparse.ArgumentParser]) -> int | None:
    """Forward ``argv`` when it (or $TORCHHPC_REMOTE, the profile, the config file) names a remote
    host; None to run it here."""
    if not argv or argv[0].startswith("-"):
        return None
    import torchhpc.remote.route as route  # not .forward: a command that stays here loads no shipping or ssh

    command = argv[0]
    sub: argparse.ArgumentParser | None = None
    if command in route.SHIPPING_COMMANDS:
        from torchhpc.cli.jobargs import split_program

        parser = build_parser(command)
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
        head, _program = split_program(sub, argv[1:])
        own = _prefix(argv, head)
    else:
        own = argv.index("--") - 1 if "--" in argv else len(argv) - 1
    found, stripped = route.extract(argv, own)
    if {"-h", "--help"} & set(stripped[1 : 1 + own]):
        return None
    options: dict[str, Any] = {}
    program: list[str] = []
    flags: list[str] = []
    sep = False
    if sub is not None:
        flags, program = split_program(sub, stripped[1:])
        n = _prefix(stripped, flags)
        sep = stripped[1 + n : 2 + n] == ["--"]
        options = vars(sub.parse_known_args(flags)[0])
    where = route.target(command, found.get("remote"), options.get("profile"))
    if where is None:
        if "ship" in found or "ship_limit" in found:
            raise UsageError("--ship and --ship-limit only apply with --remote",
                             "add --remote [USER@]HOST, or drop them")
        return None
    from torchhpc.remote.forward import Request, forward
    from torchhpc.remote.ship import DEFAULT_LIMIT

    limit = DEFAULT_LIMIT
    raw_limit = found.get("ship_limit") or os.environ.get(route.ENV_LIMIT)
    if raw_limit:
        from torchhpc.core.units import parse_size

        limit = parse_size(raw_limit, "--ship-limit")
    req = Request(argv=stripped, host=where[0], ship=found.get("ship") or "worktree", limit=limit,
                  program=program, flags=flags, sep=sep, options=options)
    return forward(req, dry_run=bool(options.get("dry_run")))
