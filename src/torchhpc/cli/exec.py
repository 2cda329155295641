"""``torchhpc exec [--] CMD...``: give CMD torch's env contract, then become it.

The per-task shim for srun-direct and mpirun when torchhpc is installed where
the task runs: detect this task's rank from whatever launcher started it,
export RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK/NODE_RANK,
MASTER_ADDR and MASTER_PORT where they are not already set, and ``execvpe``
the command (same PID, so signals from srun/mpirun reach it directly). No
torch import: this runs before every rank's Python starts.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from torchhpc.cli.common import add_subparser, after_dashdash, env_default, eprint
from torchhpc.core.shell import join
from torchhpc.env import conflicts, detect, export
from torchhpc.errors import CommandNotFound, UsageError
from torchhpc.launchers.boot import boot_pythonpath


class ExecNotFound(CommandNotFound):
    """The command to exec is missing: exit 127, as a shell would."""

    exit_code = 127


def register(sub: Any) -> None:
    p = add_subparser(
        sub,
        "exec",
        "export torch's RANK/WORLD_SIZE/LOCAL_RANK/MASTER_* for this task, then exec a command",
        description=__doc__,
    )
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=bool(env_default("--exec-verbose", "")),
        help="print what was detected and exported to stderr (env: TORCHHPC_EXEC_VERBOSE)",
    )
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="[--] CMD ...", help="the command to run")
    p.set_defaults(func=cmd_exec)


def cmd_exec(args: argparse.Namespace) -> int:
    argv = after_dashdash(args.command)
    if not argv:
        raise UsageError("torchhpc exec needs a command", "e.g. `srun torchhpc exec -- python train.py`")
    dist_env = detect()
    clashes = conflicts(dist_env, os.environ)
    env = dict(os.environ)  # the command's, not this process's: a failed exec leaves os.environ as it was
    added = export(dist_env, env)
    if args.verbose:
        eprint(
            f"torchhpc exec: {dist_env.source} rank {dist_env.rank}/{dist_env.world_size} "
            f"local {dist_env.local_rank}/{dist_env.local_world_size} "
            f"master {dist_env.master_addr}:{dist_env.master_port}; exported {' '.join(sorted(added)) or 'nothing'}"
        )
    for name, (have, detected) in sorted(clashes.items()):
        eprint(f"torchhpc exec: keeping {name}={have} set by the user (detected {detected})")
    boot = boot_pythonpath(env)  # the exit cures in the rank (launchers/boot.py), unless switched off
    if boot:
        env["PYTHONPATH"] = boot
    try:
        os.execvpe(argv[0], argv, env)
    except FileNotFoundError:
        raise ExecNotFound(argv, f"`{join(argv[:1])}` is not on PATH in this task") from None
    except PermissionError:
        raise UsageError(f"`{join(argv[:1])}` is not executable", "check the file's mode and path") from None
    return 0  # not reached
