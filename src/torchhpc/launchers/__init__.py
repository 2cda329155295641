"""Launchers: argv builders for torchrun, srun-direct and mpirun.

The geometry each launcher needs is the users' most common failure, so it is
stated once, in :mod:`torchhpc.launchers.kinds`: torchrun is one task per node
(it forks the local workers); srun-direct and mpirun are one task per process.
Builders take argv and return argv; the scheduler turns them into shell text
through :mod:`torchhpc.core.shell`.
"""

from __future__ import annotations

from torchhpc.launchers.boot import TASK_REF, TASK_SH, task_argv
from torchhpc.launchers.builders import mpirun_argv, srun_argv, torchrun_argv
from torchhpc.launchers.kinds import LAUNCHERS, MPIRUN, SRUN, TORCHRUN, Launcher, get_launcher, launcher_of

__all__ = [
    "LAUNCHERS",
    "MPIRUN",
    "SRUN",
    "TASK_REF",
    "TASK_SH",
    "TORCHRUN",
    "Launcher",
    "get_launcher",
    "launcher_of",
    "mpirun_argv",
    "srun_argv",
    "task_argv",
    "torchrun_argv",
]
