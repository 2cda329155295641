"""Entry point of the ``torchhpc`` command.

Each subcommand lives in its own module under ``torchhpc.cli`` and exposes
``register(subparsers)``; the list below is the one place that names them.
Modules must stay light at import time (no torch): ``torchhpc --help`` is part
of every job's start-up.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import sys
from collections.abc import Sequence

from torchhpc import __version__
from torchhpc.cli.parser import Parser, print_json_error
from torchhpc.errors import TorchHPCError, UsageError

# Subcommand modules, in --help order. Each has register(subparsers).
COMMANDS: tuple[str, ...] = (
    "run",
    "sweep",
    "pipeline",
    "jobs",
    "logs",
    "diagnose",
    "events",
    "top",
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
    "config",
    "completion",
)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The full parser, or (``only``) one subcommand's: a job launch should not import all of them."""
    parser = Parser(
        prog="torchhpc",
        description=(
            "Distributed PyTorch on real clusters: one job description rendered for "
            "local, Slurm, PBS, Kubernetes and RunAI, with torchrun, srun or mpirun, in any container."
        ),
        epilog="Every command has --help. Render before you submit: `torchhpc run --dry-run ...`.",
    )
    parser.add_argument("--version", action="version", version=f"torchhpc {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS if only is None else (only,):
        try:
            module = importlib.import_module(f"torchhpc.cli.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"torchhpc.cli.{name}":
                continue  # subcommand not built yet
            raise
        module.register(sub)
    return parser


def _run_flags(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """``run``'s own flags: a ``--help`` after the program is the program's (``train.py --help``)."""
    from torchhpc.cli.jobargs import split_program

    return split_program(_subparser(parser, "run"), argv)[0]


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    for action in parser._subparsers._actions if parser._subparsers else []:
        if isinstance(action, argparse._SubParsersAction):
            sub: argparse.ArgumentParser = action.choices[name]
            return sub
    raise KeyError(name)


def _wants_json(parser: argparse.ArgumentParser, argv: list[str]) -> bool:
    """``--json`` as the command's output switch (``status --json``), not a flag that takes a file
    (``bench nodes --json FILE``): only then are its errors JSON, parse errors included."""
    words = _run_flags(parser, argv[1:]) if argv[:1] == ["run"] else argv
    if "--json" not in words or not isinstance(parser, Parser):
        return False
    owner = parser._owner(argv)
    return any("--json" in a.option_strings and a.nargs == 0 for a in owner._actions)


def _report(e: TorchHPCError) -> int:
    if Parser.json_errors:  # --json: every error is one JSON object on stdout (README, "Exit codes")
        print_json_error(e.message, e.hint, e.exit_code)
        return e.exit_code
    print(f"Error: {e.message}", file=sys.stderr)
    if e.hint:
        print(f"HINT: {e.hint}", file=sys.stderr)
    return e.exit_code


def _switches_then_action(words: list[str]) -> bool:
    """`sweep --json status DIR`: only --json before the action, so the words are status's, not a program's."""
    i = next((n for n, w in enumerate(words) if not w.startswith("-")), len(words))
    return words[i:i + 1] in (["status"], ["report"]) and set(words[:i]) <= {"--json"}


def main(argv: Sequence[str] | None = None) -> int:
    # Start-up (the parser, the subcommand's modules) makes only objects that live as long as the process:
    # collecting garbage among them is wasted work (~5 ms of a 0.1 s submit). The collector is back, and
    # never walks them again (freeze), before the command itself runs, however long it runs.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _main(argv, collecting)
    finally:
        if argv is None:  # the command's own process: its exit need not walk every object left (~7 ms of a submit)
            gc.freeze()
        else:
            gc.unfreeze()  # a caller that runs main() many times (the tests) keeps collecting what each left
        if collecting:
            gc.enable()


def _main(argv: Sequence[str] | None, collecting: bool = True) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["help"]:  # git's `help COMMAND`: the command's --help (torchhpc help: the overview)
        argv = [*argv[1:], "--help"]
    if argv[:1] == ["run"]:
        from torchhpc.schedulers import ask_early

        ask_early(argv[1:])
    parser = build_parser(only="run" if argv and argv[0] == "run" else None)
    Parser.json_errors = _wants_json(parser, argv)
    try:  # --remote HOST (or TORCHHPC_REMOTE): the login node's torchhpc runs the line (docs/remote.md)
        from torchhpc.cli.remote import intercept

        forwarded = intercept(argv, lambda only: parser if only == "run" else build_parser(only=only))
    except TorchHPCError as e:
        return _report(e)
    except KeyboardInterrupt:
        print("Interrupted.", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    if forwarded is not None:
        return forwarded
    if argv and argv[0] == "run" and not ({"-h", "--help"} & set(_run_flags(parser, argv[1:]))):
        # `run` splits its own line: flags may follow the program (`... pi.py --wait`).
        from torchhpc.cli import run as run_cli

        args = argparse.Namespace(func=run_cli.cmd_run, _parser=_subparser(parser, "run"), _argv=argv[1:])
    elif argv[:1] == ["sweep"] and argv[1:2] and argv[1] not in ("status", "report", "-h", "--help") \
            and not _switches_then_action(argv[1:]):
        from torchhpc.core.suggest import did_you_mean

        near = did_you_mean(argv[1], ("status", "report")) if not argv[1].startswith("-") else ""
        if near:  # `sweep statsu DIR`: a mistyped action, not a program named statsu
            return _report(UsageError(f"sweep: {argv[1]!r} is not an action", f"{near} (torchhpc sweep status|report DIR)"))
        # `sweep` (not its status/report) splits its line like `run`: the program's flags are its own.
        from torchhpc.cli import sweep as sweep_cli

        sweep_parser = _subparser(build_parser(only="sweep"), "sweep")
        args = argparse.Namespace(func=sweep_cli.cmd_sweep, _parser=sweep_parser, _argv=argv[1:])
    else:
        args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from torchhpc.config import serve_slurm

    serve_slurm()  # a running `torchhpc devcluster` serves Slurm commands on a machine without Slurm of its own
    args._build_parser = build_parser  # the whole parser, for `completion` (cli modules never import main)
    gc.freeze()
    if collecting:
        gc.enable()
    try:
        rc = args.func(args)
    except TorchHPCError as e:
        return _report(e)
    except KeyboardInterrupt:
        print("Interrupted.", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except OSError as e:  # a path the user gave that cannot be written or read: their fix, in one line
        return _report(_os_error(e))
    except Exception as e:  # never a traceback for a user; TORCHHPC_DEBUG=1 shows it for a bug report
        import os

        if os.environ.get("TORCHHPC_DEBUG"):
            raise
        return _report(TorchHPCError(f"internal error: {type(e).__name__}: {e}",
                                     "this is a torchhpc bug: rerun with TORCHHPC_DEBUG=1 for the traceback and report it"))
    return int(rc or 0)


def _os_error(e: OSError) -> TorchHPCError:
    """``FileNotFoundError: [Errno 2] ... '/x/y.png'`` as one line that names the path and the fix."""
    import errno
    import os

    path = e.filename or ""
    what = e.strerror or str(e)
    if e.errno == errno.ENOENT and path and not os.path.isdir(os.path.dirname(os.path.abspath(path)) or "/"):
        hint = f"the directory {os.path.dirname(os.path.abspath(path))} does not exist: create it, or choose another path"
    elif e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        hint = "choose a path you can write (or read), e.g. under your home or the current directory"
    else:
        hint = "check the path"
    return TorchHPCError(f"{path}: {what}" if path else what, hint)


if __name__ == "__main__":
    raise SystemExit(main())
