"""Helpers shared by subcommands: env-var defaults, the standard job flags, output."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any


def env_default(flag: str, default: Any = None, cast: type | None = None) -> Any:
    """Default for ``--some-flag`` from ``TORCHHPC_SOME_FLAG``.

    Precedence: command line > TORCHHPC_* variable > profile > built-in default.
    """
    name = "TORCHHPC_" + flag.lstrip("-").upper().replace("-", "_")
    if name in os.environ:
        value = os.environ[name]
        return cast(value) if cast else value
    return default


def json_errors(func: Any) -> Any:
    """With ``--json``, an error is a JSON object on stdout (same exit code), not text on stderr."""
    import functools

    from torchhpc.errors import TorchHPCError

    @functools.wraps(func)
    def wrapper(args: argparse.Namespace, *rest: Any) -> int:
        try:
            return int(func(args, *rest))
        except TorchHPCError as e:
            if not getattr(args, "json", False):
                raise
            from torchhpc.cli.parser import print_json_error

            print_json_error(e.message, e.hint, e.exit_code)
            return e.exit_code

    return wrapper


def print_json(value: Any, indent: int | None = None) -> None:
    """Every ``--json`` output: strict JSON (a float that is not finite, such as "never" sorted as ``inf``,
    becomes null; ``Infinity`` is refused by JavaScript, Go and serde), one document on stdout."""
    import json

    sys.stdout.write(json.dumps(strict_json(value), indent=indent, allow_nan=False) + "\n")
    sys.stdout.flush()


def strict_json(value: Any) -> Any:
    """``value`` with every float that is not finite as None, tuples as lists."""
    import math

    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    return value


def eprint(*args: object) -> None:
    print(*args, file=sys.stderr, flush=True)


def announce_target(scheduler: Any, dry_run: bool = False) -> str | None:
    """Say on stderr, in one line, when jobs go to a dev cluster rather than the site's own scheduler.

    A dry run says nothing there (its output is the render; it touches no cluster), but its JSON
    carries the line too (docs/slurm-target.md).
    """
    line: str | None = scheduler.target()
    if line and not dry_run:
        eprint(f"torchhpc: {line}")
    return line


class Progress:
    """One status line on a TTY (rewritten in place), plain lines otherwise, only on change."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream or sys.stderr
        self.last = ""
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()

    def update(self, text: str) -> None:
        if self.tty:
            self.stream.write("\r\033[K" + text)
            self.stream.flush()
        elif _steady(text) != _steady(self.last):  # the clock alone moved: no new line (an hour pending: one line)
            self.stream.write(text + "\n")
            self.stream.flush()
        self.last = text

    def done(self) -> None:
        if self.tty and self.last:
            self.stream.write("\n")
            self.stream.flush()


def _steady(text: str) -> str:
    """A progress line without its clock (``elapsed 00:01:02``, ``waited 12s``): what a new line must change."""
    return text.split(" elapsed")[0].split(" waited ")[0]


def plain(text: str) -> str:
    """Docstring markup to what a terminal shows: ``:func:`x``` and double backticks become `x`."""
    import re

    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", text)
    return re.sub(r"``(.+?)``", r"`\1`", text, flags=re.S)


def add_subparser(sub: Any, name: str, help: str, description: str | None = None) -> argparse.ArgumentParser:
    """A subcommand whose description may be a module docstring: shown as plain text, never RST."""
    p: argparse.ArgumentParser = sub.add_parser(
        name, help=plain(help), description=plain(description or help),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return p


def help_when_bare(p: argparse.ArgumentParser) -> None:
    """A command of actions named without one (``torchhpc net``): its help, exit 2."""

    def show(_args: argparse.Namespace) -> int:
        p.print_help()
        return 2

    p.set_defaults(func=show)


def after_dashdash(words: list[str]) -> list[str]:
    """A REMAINDER's words without the ``--`` that may open them."""
    return words[1:] if words[:1] == ["--"] else list(words)


def add_hang_arguments(p: Any) -> None:
    """--hang-timeout / --on-hang, for commands that follow a job (a foreground local run, run --wait, wait)."""

    from torchhpc.core.units import parse_timeout
    from torchhpc.errors import SpecError

    def seconds(v: str) -> float:
        """0.0 for off: also over a config file's or $TORCHHPC_HANG_TIMEOUT's value (core/units.py's grammar)."""
        try:
            return parse_timeout(v, "--hang-timeout")
        except SpecError as e:
            raise argparse.ArgumentTypeError(e.message.removeprefix("--hang-timeout ")) from None

    p.add_argument("--hang-timeout", type=seconds, default=env_default("--hang-timeout", None), metavar="SECONDS|off",
                   help="while torchhpc follows the job (a local run in the foreground, --wait, wait): when no rank has "
                        "printed or used CPU for this long, read every rank's stack "
                        "(py-spy), name the culprit, then --on-hang (a hang ends the run with 81; other endings keep their "
                        "own code); off (or 0) turns it off [TORCHHPC_HANG_TIMEOUT]")
    p.add_argument("--on-hang", choices=("cancel", "requeue"), default=env_default("--on-hang", "cancel"),
                   help="what to do with a hung job after its diagnosis is saved (default: cancel)")
