#!/usr/bin/env python3
"""Regenerate docs/cli.md from the CLI's own --help (docs are code: tests/unit/test_docs.py checks it)."""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "cli.md"


def _help(parser: argparse.ArgumentParser) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        parser.print_help()
    return buf.getvalue().rstrip() + "\n"


def _walk(parser: argparse.ArgumentParser, path: list[str]) -> list[tuple[list[str], str]]:
    out = [(path, _help(parser))]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                if sub.prog.split()[-1] != name:  # aliases
                    continue
                out.extend(_walk(sub, [*path, name]))
    return out


def render() -> str:
    import os

    os.environ["COLUMNS"] = "100"
    from torchhpc.cli.main import build_parser

    parts = [
        "# torchhpc command reference\n",
        "Generated from `--help` by `scripts/gen_cli_docs.py`; `tests/unit/test_docs.py` fails when it is stale.\n",
    ]
    for path, text in _walk(build_parser(), ["torchhpc"]):
        parts.append(f"\n## `{' '.join(path)}`\n\n```text\n{text}```\n")
    return "".join(parts)


if __name__ == "__main__":
    DOC.parent.mkdir(exist_ok=True)
    DOC.write_text(render())
    print(f"wrote {DOC}", file=sys.stderr)
