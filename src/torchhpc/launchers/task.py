"""The per-task shim that gives every launcher torch's ``env://`` contract.

srun-direct and mpirun start one process per rank but export only their own
variables (``SLURM_PROCID``, ``OMPI_COMM_WORLD_RANK``, ``PMI_RANK``). An
unmodified script that calls ``init_process_group()`` and reads ``LOCAL_RANK``
needs RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and
MASTER_PORT. The shim is plain bash (no Python, no torchhpc needed inside a
container), run as ``bash -c SHIM torchhpc-task CMD...``: it maps the
launcher's variables, then ``exec``s the command, so signals reach it directly.

MPI variables win over Slurm's: an ``mpirun`` inside an allocation sees the
SLURM_* of the batch step, which do not describe its ranks. MASTER_ADDR and
MASTER_PORT are only defaulted: the batch script exports the job's values.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["SHIM_VAR", "TASK_SHIM", "task_argv"]

TASK_SHIM = r"""set -e
if [ -n "${OMPI_COMM_WORLD_RANK:-}" ]; then
  RANK=$OMPI_COMM_WORLD_RANK WORLD_SIZE=$OMPI_COMM_WORLD_SIZE
  LOCAL_RANK=${OMPI_COMM_WORLD_LOCAL_RANK:-0} LOCAL_WORLD_SIZE=${OMPI_COMM_WORLD_LOCAL_SIZE:-1}
elif [ -n "${PMI_RANK:-}" ]; then
  RANK=$PMI_RANK WORLD_SIZE=$PMI_SIZE
  LOCAL_RANK=${MPI_LOCALRANKID:-${PALS_LOCAL_RANKID:-0}} LOCAL_WORLD_SIZE=${MPI_LOCALNRANKS:-${PALS_LOCAL_SIZE:-1}}
elif [ -n "${SLURM_PROCID:-}" ]; then
  RANK=$SLURM_PROCID WORLD_SIZE=${SLURM_STEP_NUM_TASKS:-${SLURM_NTASKS:-1}} LOCAL_RANK=${SLURM_LOCALID:-0}
  LOCAL_WORLD_SIZE=1 _i=0
  IFS=, read -ra _groups <<< "${SLURM_STEP_TASKS_PER_NODE:-${SLURM_TASKS_PER_NODE:-1}}"
  for _g in "${_groups[@]}"; do
    _n=${_g%%(*} _r=1
    case $_g in *"(x"*) _r=${_g#*(x} _r=${_r%)} ;; esac
    if [ "${SLURM_NODEID:-0}" -lt $((_i + _r)) ]; then LOCAL_WORLD_SIZE=$_n; break; fi
    _i=$((_i + _r))
  done
else
  RANK=${RANK:-0} WORLD_SIZE=${WORLD_SIZE:-1} LOCAL_RANK=${LOCAL_RANK:-0} LOCAL_WORLD_SIZE=${LOCAL_WORLD_SIZE:-1}
fi
GROUP_RANK=$((RANK / LOCAL_WORLD_SIZE))
: "${MASTER_ADDR:=127.0.0.1}" "${MASTER_PORT:=29500}"
export RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK MASTER_ADDR MASTER_PORT
export NODE_RANK=$GROUP_RANK
exec "$@"
"""


# Batch scripts define the shim once under this name and pass "$TORCHHPC_TASK_SHIM".
SHIM_VAR = "TORCHHPC_TASK_SHIM"


def task_argv(command: Sequence[str], shim: str = TASK_SHIM) -> list[str]:
    """Wrap one rank's command in the shim: ``bash -c SHIM torchhpc-task CMD...``.

    Pass ``shim=Raw('"$TORCHHPC_TASK_SHIM"')`` when the script defines it once.
    """
    return ["bash", "-c", shim, "torchhpc-task", *command]
