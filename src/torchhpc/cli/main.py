"""Entry point of the ``torchhpc`` command.

Each subcommand lives in its own module under ``torchhpc.cli`` and exposes
``register(subparsers)``; the list below is the one place that names them.
Modules must stay light at import time (no torch): ``torchhpc --help`` is part
of every job's start-up.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from torchhpc import __version__
from torchhpc.errors import TorchHPCError

# Subcommand modules, in --help order. Each has register(subparsers).
COMMANDS: tuple[str, ...] = (
    "run",
    "jobs",
    "shell",
    "env",
    "exec",
    "devcluster",
    "bench",
    "net",
    "doctor",
    "profiles",
    "container",
    "options",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="torchhpc",
        description=(
            "Distributed PyTorch on real clusters: one job description rendered for "
            "local, Slurm, PBS, Kubernetes and RunAI, with torchrun, srun or mpirun, in any container."
        ),
        epilog="Every command has --help. Render before you submit: `torchhpc run --dry-run ...`.",
    )
    parser.add_argument("--version", action="version", version=f"torchhpc {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"torchhpc.cli.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"torchhpc.cli.{name}":
                continue  # subcommand not built yet
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        rc = args.func(args)
    except TorchHPCError as e:
        print(f"Error: {e.message}", file=sys.stderr)
        if e.hint:
            print(f"HINT: {e.hint}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("Interrupted.", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    return int(rc or 0)


if __name__ == "__main__":
    raise SystemExit(main())
