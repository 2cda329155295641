"""The per-task shim that gives every launcher torch's ``env://`` contract.

srun-direct and mpirun start one process per rank but export only their own
variables (``SLURM_PROCID``, ``OMPI_COMM_WORLD_RANK``, ``PMI_RANK``). An
unmodified script that calls ``init_process_group()`` and reads ``LOCAL_RANK``
needs RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and
MASTER_PORT. The shim is plain bash (no Python, no torchhpc needed inside a
container), a file of the boot directory (src/torchhpc/boot/task.sh, one ``case``
per launcher), run as ``bash task.sh LAUNCHER CMD...``: it maps the launcher's
variables, then ``exec``s the command, so signals reach it directly.

The rule (docs/compat.md has the table, variable x launcher): every rank/world
variable that a well-known detector reads (Lightning, submitit, idr_torch,
torch's ``is_torchelastic_launched()``, scripts written for Slurm or Open MPI)
either describes *this process* or is absent:

- ``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NODEID``, ``SLURM_NTASKS``,
  ``SLURM_*TASKS_PER_NODE``, ``SLURM_STEP_NUM_TASKS``, ``SLURM_GTIDS``,
  ``SLURM_NNODES``, ``SLURM_STEP_NUM_NODES`` and the step's node list under
  mpirun and torchrun describe the srun step of OpenMPI's daemons (on the other
  nodes only: mpirun forks its own node's ranks in the batch step) or of the
  torchrun agents (one task per node): they are **rewritten** to the rank's
  values, so Slurm-reading code still sees a Slurm job (job id, requeue) with
  the right world. Job-level and step-level identity (``SLURM_JOB_*``,
  ``SLURM_STEP_ID``, ``SLURM_CPUS_PER_TASK``...) is
  never touched: srun, scontrol and the nothing-lost requeue keep working.
- ``OMPI_COMM_WORLD_*``, ``PMI_RANK``/``PMI_SIZE``, ``MV2_COMM_WORLD_*`` that
  do not match this rank are **unset**: faking them would make MPI-aware code
  (DeepSpeed, Horovod) expect an MPI world that ``MPI_Init`` cannot join.
- ``TORCHELASTIC_*`` (and torchrun's ``ROLE_*``, ``GROUP_WORLD_SIZE``) outside
  torchrun are **unset**: they claim an elastic agent that is not there
  (``TORCHELASTIC_USE_AGENT_STORE`` would even make ``env://`` connect to it).

The launcher is the first argument (``srun``, ``mpirun``, ``torchrun``); ``auto``
guesses from the variables (MPI first: an mpirun inside an allocation also sees
SLURM_*). Internal variables use the
reserved prefix ``_torchhpc_`` so a user's variable is never clobbered.
MASTER_ADDR and MASTER_PORT are only defaulted: the batch script exports the job's values.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from torchhpc.launchers.boot import BOOT_DIR, boot_ref

__all__ = ["LAUNCHERS", "TASK_REF", "TASK_SH", "task_argv"]

# The launchers the shim knows by name (its first argument; "auto" guesses).
LAUNCHERS = ("srun", "mpirun", "torchrun")
# The shim in the installed package, and a batch script's word for it (its boot directory's copy).
TASK_SH = os.path.join(BOOT_DIR, "task.sh")
TASK_REF = boot_ref("task.sh")


def task_argv(command: Sequence[str], shim: str = TASK_SH, launcher: str | None = None) -> list[str]:
    """Wrap one rank's command in the shim: ``bash SHIM LAUNCHER CMD...``.

    ``shim=TASK_REF`` in a batch script (``"$TORCHHPC_BOOT_DIR/task.sh"``). Name the ``launcher`` so stale
    variables of another launcher can never win; None guesses (``auto``).
    """
    if launcher is not None and launcher not in LAUNCHERS:
        raise ValueError(f"unknown launcher {launcher!r} for the task shim (one of {', '.join(LAUNCHERS)})")
    return ["bash", shim, launcher or "auto", *command]
