"""The per-task shim that gives every launcher torch's ``env://`` contract.

srun-direct and mpirun start one process per rank but export only their own
variables (``SLURM_PROCID``, ``OMPI_COMM_WORLD_RANK``, ``PMI_RANK``). An
unmodified script that calls ``init_process_group()`` and reads ``LOCAL_RANK``
needs RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and
MASTER_PORT. The shim is plain bash (no Python, no torchhpc needed inside a
container), run as ``bash -c SHIM torchhpc-task[-LAUNCHER] CMD...``: it maps
the launcher's variables, then ``exec``s the command, so signals reach it directly.

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

The launcher is named by ``$0`` (``torchhpc-task-srun``, ``-mpirun``,
``-torchrun``); plain ``torchhpc-task`` guesses from the variables (MPI first:
an mpirun inside an allocation also sees SLURM_*). Internal variables use the
reserved prefix ``_torchhpc_`` so a user's variable is never clobbered.
MASTER_ADDR and MASTER_PORT are only defaulted: the batch script exports the job's values.
"""

from __future__ import annotations

from collections.abc import Sequence

from torchhpc.launchers.boot import boot_line

__all__ = ["BRANCHES", "LAUNCHERS", "SHIM_VAR", "TASK_SHIM", "shim_for", "shim_name", "task_argv"]

# The launchers the shim knows by name ($0 = torchhpc-task-NAME).
LAUNCHERS = ("srun", "mpirun", "torchrun")

# The shim in parts, so a batch script carries only its launcher's branch (:func:`shim_for`):
# how each launcher names this process's rank (the branches), then what every launcher does.
_DETECT = r"""case $0 in
  torchhpc-task-*) _torchhpc_launcher=${0#torchhpc-task-} ;;
  *) if [ -n "${OMPI_COMM_WORLD_RANK:-}" ] || [ -n "${PMI_RANK:-}" ]; then _torchhpc_launcher=mpirun
     elif [ -n "${SLURM_PROCID:-}" ]; then _torchhpc_launcher=srun
     else _torchhpc_launcher=none; fi ;;
esac
"""
BRANCHES = {
    "torchrun": r"""if [ -z "${TORCHELASTIC_RUN_ID:-}" ] || [ -z "${LOCAL_RANK:-}" ] || [ -z "${RANK:-}" ]; then
  echo "torchhpc-task: started for torchrun, but RANK/LOCAL_RANK/TORCHELASTIC_RUN_ID are not set" >&2; exit 2
fi
: "${LOCAL_WORLD_SIZE:=1}" "${GROUP_RANK:=$((RANK / LOCAL_WORLD_SIZE))}"
""",
    "mpirun": r"""if [ -n "${OMPI_COMM_WORLD_RANK:-}" ]; then
  RANK=$OMPI_COMM_WORLD_RANK WORLD_SIZE=$OMPI_COMM_WORLD_SIZE
  LOCAL_RANK=${OMPI_COMM_WORLD_LOCAL_RANK:-0} LOCAL_WORLD_SIZE=${OMPI_COMM_WORLD_LOCAL_SIZE:-1}
elif [ -n "${PMI_RANK:-}" ]; then
  RANK=$PMI_RANK WORLD_SIZE=$PMI_SIZE
  LOCAL_RANK=${MPI_LOCALRANKID:-${PALS_LOCAL_RANKID:-0}} LOCAL_WORLD_SIZE=${MPI_LOCALNRANKS:-${PALS_LOCAL_SIZE:-1}}
else
  echo "torchhpc-task: started for mpirun, but neither OMPI_COMM_WORLD_RANK nor PMI_RANK is set" >&2; exit 2
fi
GROUP_RANK=$((RANK / LOCAL_WORLD_SIZE))
""",
    "srun": r"""if [ -z "${SLURM_PROCID:-}" ]; then echo "torchhpc-task: started for srun, but SLURM_PROCID is not set" >&2; exit 2; fi
RANK=$SLURM_PROCID WORLD_SIZE=${SLURM_STEP_NUM_TASKS:-${SLURM_NTASKS:-1}} LOCAL_RANK=${SLURM_LOCALID:-0} LOCAL_WORLD_SIZE=1 _torchhpc_i=0
IFS=, read -ra _torchhpc_groups <<< "${SLURM_STEP_TASKS_PER_NODE:-${SLURM_TASKS_PER_NODE:-1}}"
for _torchhpc_g in "${_torchhpc_groups[@]}"; do
  _torchhpc_n=${_torchhpc_g%%(*} _torchhpc_r=1
  case $_torchhpc_g in *"(x"*) _torchhpc_r=${_torchhpc_g#*(x} _torchhpc_r=${_torchhpc_r%)} ;; esac
  if [ "${SLURM_NODEID:-0}" -lt $((_torchhpc_i + _torchhpc_r)) ]; then LOCAL_WORLD_SIZE=$_torchhpc_n; break; fi
  _torchhpc_i=$((_torchhpc_i + _torchhpc_r))
done
GROUP_RANK=${SLURM_NODEID:-$((RANK / LOCAL_WORLD_SIZE))}
""",
    "none": r"""RANK=${RANK:-0} WORLD_SIZE=${WORLD_SIZE:-1} LOCAL_RANK=${LOCAL_RANK:-0} LOCAL_WORLD_SIZE=${LOCAL_WORLD_SIZE:-1}
GROUP_RANK=$((RANK / LOCAL_WORLD_SIZE))
""",
}
# MPI worlds that are not this rank's: unset (every launcher). PMI_: only its RANK and SIZE (PMI_FD... are the PM's).
_MPI_UNSET = r"""for _torchhpc_p in OMPI_COMM_WORLD_ PMI_ MV2_COMM_WORLD_; do
  _torchhpc_r=${_torchhpc_p}RANK _torchhpc_s=${_torchhpc_p}SIZE
  if [ -n "${!_torchhpc_r:-}${!_torchhpc_s:-}" ] && [ "${!_torchhpc_r:-}:${!_torchhpc_s:-}" != "$RANK:$WORLD_SIZE" ]; then
    case $_torchhpc_p in PMI_) unset PMI_RANK PMI_SIZE ;; OMPI_*) unset "${!OMPI_COMM_WORLD_@}" ;; *) unset "${!MV2_COMM_WORLD_@}" ;; esac
  fi
done
"""
# An elastic agent that is not there (every launcher but torchrun).
_ELASTIC_UNSET = r"""for _torchhpc_v in "${!TORCHELASTIC_@}"; do unset "$_torchhpc_v"; done
unset ROLE_RANK ROLE_NAME ROLE_WORLD_SIZE GROUP_WORLD_SIZE
"""
# The srun step of mpirun's daemons or torchrun's agents, rewritten to this rank (every launcher but srun).
_SLURM_REWRITE = r"""if [ -n "${SLURM_PROCID:-}" ]; then
  SLURM_PROCID=$RANK SLURM_LOCALID=$LOCAL_RANK SLURM_NODEID=$GROUP_RANK
  SLURM_NTASKS=$WORLD_SIZE SLURM_STEP_NUM_TASKS=$WORLD_SIZE SLURM_NTASKS_PER_NODE=$LOCAL_WORLD_SIZE
  export SLURM_PROCID SLURM_LOCALID SLURM_NODEID SLURM_NTASKS SLURM_STEP_NUM_TASKS SLURM_NTASKS_PER_NODE
  if [ -n "${SLURM_NPROCS:-}" ]; then export SLURM_NPROCS=$WORLD_SIZE; fi
  _torchhpc_n=$((WORLD_SIZE / LOCAL_WORLD_SIZE))
  if [ -n "${SLURM_NNODES:-}" ]; then export SLURM_NNODES=$_torchhpc_n; fi
  if [ -n "${SLURM_STEP_NUM_NODES:-}" ]; then export SLURM_STEP_NUM_NODES=$_torchhpc_n; fi
  if [ "$_torchhpc_n" = "${SLURM_JOB_NUM_NODES:-}" ] && [ -n "${SLURM_JOB_NODELIST:-}" ]; then
    if [ -n "${SLURM_NODELIST:-}" ]; then export SLURM_NODELIST=$SLURM_JOB_NODELIST; fi
    if [ -n "${SLURM_STEP_NODELIST:-}" ]; then export SLURM_STEP_NODELIST=$SLURM_JOB_NODELIST; fi
  fi
  if [ $((_torchhpc_n * LOCAL_WORLD_SIZE)) -eq "$WORLD_SIZE" ]; then
    _torchhpc_g=$LOCAL_WORLD_SIZE
    if [ "$_torchhpc_n" -gt 1 ]; then _torchhpc_g="$LOCAL_WORLD_SIZE(x$_torchhpc_n)"; fi
    export SLURM_TASKS_PER_NODE=$_torchhpc_g SLURM_STEP_TASKS_PER_NODE=$_torchhpc_g
    _torchhpc_i=$((GROUP_RANK * LOCAL_WORLD_SIZE)) _torchhpc_g=""
    while [ "$_torchhpc_i" -lt $(((GROUP_RANK + 1) * LOCAL_WORLD_SIZE)) ]; do
      _torchhpc_g=$_torchhpc_g${_torchhpc_g:+,}$_torchhpc_i _torchhpc_i=$((_torchhpc_i + 1))
    done
    export SLURM_GTIDS=$_torchhpc_g
  else
    unset SLURM_TASKS_PER_NODE SLURM_STEP_TASKS_PER_NODE SLURM_GTIDS
  fi
fi
"""
# One GPU per rank from the node's list (every launcher but torchrun, whose agent sets it).
_GPU = r"""if [ -n "${TORCHHPC_GPU_PER_TASK:-}" ]; then
  IFS=, read -ra _torchhpc_l <<< "${!TORCHHPC_GPU_PER_TASK:-}"
  export "$TORCHHPC_GPU_PER_TASK=${_torchhpc_l[$LOCAL_RANK]:-$LOCAL_RANK}"
fi
"""
# CPU masks per local rank (mpirun only: srun and torchrun bind by their own flags).
_MASKS = r"""if [ -n "${TORCHHPC_CPU_MASKS:-}" ]; then
  IFS=, read -ra _torchhpc_l <<< "$TORCHHPC_CPU_MASKS"
  taskset -p "${_torchhpc_l[$((LOCAL_RANK % ${#_torchhpc_l[@]}))]}" $$ >/dev/null 2>&1 \
    || echo "torchhpc-task: rank $RANK: taskset could not apply a mask of TORCHHPC_CPU_MASKS" >&2
fi
"""
# The exit cures (launchers/boot.py): the boot directory the script exported, first on PYTHONPATH.
_TAIL = r""": "${MASTER_ADDR:=127.0.0.1}" "${MASTER_PORT:=29500}"
export RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK MASTER_ADDR MASTER_PORT
export NODE_RANK=$GROUP_RANK
""" + boot_line() + 'exec "$@"\n'


def _indent(text: str, by: str = "  ") -> str:
    return "".join(by + line if line.strip() else line for line in text.splitlines(keepends=True))


def _guarded(text: str, condition: str) -> str:
    return f"if {condition}; then\n{_indent(text)}fi\n"


# The whole shim: the launcher from $0 (or guessed), every branch.
TASK_SHIM = (
    "set -e\n"
    + _DETECT
    + "case $_torchhpc_launcher in\n"
    + "".join(f"{name})\n{_indent(body).rstrip()} ;;\n" for name, body in BRANCHES.items())
    + """*) echo "torchhpc-task: unknown launcher '$_torchhpc_launcher' (srun, mpirun or torchrun)" >&2; exit 2 ;;\n"""
    + "esac\n"
    + _MPI_UNSET
    + _guarded(_ELASTIC_UNSET, '[ "$_torchhpc_launcher" != torchrun ]')
    + _SLURM_REWRITE.replace('if [ -n "${SLURM_PROCID:-}" ]', 'if [ "$_torchhpc_launcher" != srun ] && [ -n "${SLURM_PROCID:-}" ]', 1)
    + _guarded(_GPU, '[ "$_torchhpc_launcher" != torchrun ]')
    + _guarded(_MASKS, '[ "$_torchhpc_launcher" = mpirun ]')
    + _TAIL
)


def shim_for(launcher: str) -> str:
    """The shim a batch script carries for one launcher: its branch only, the same rules after it.

    ``$0`` no longer picks the branch (it still names the process, ``torchhpc-task-LAUNCHER``).
    """
    if launcher not in BRANCHES or launcher == "none":
        raise ValueError(f"unknown launcher {launcher!r} for the task shim (one of {', '.join(LAUNCHERS)})")
    parts = (_ELASTIC_UNSET * (launcher != "torchrun"), _SLURM_REWRITE * (launcher != "srun"),
             _GPU * (launcher != "torchrun"), _MASKS * (launcher == "mpirun"))  # each for the launchers it concerns
    return "set -e\n" + BRANCHES[launcher] + _MPI_UNSET + "".join(parts) + _TAIL


# Batch scripts define the shim once, in their generated helpers, under this name and pass
# "$_torchhpc_task_shim" (the reserved prefix: no --env can replace it before the launch).
SHIM_VAR = "_torchhpc_task_shim"


def shim_name(launcher: str | None = None) -> str:
    """``$0`` of the shim: ``torchhpc-task-LAUNCHER`` names the launcher, ``torchhpc-task`` guesses."""
    if launcher is None:
        return "torchhpc-task"
    if launcher not in LAUNCHERS:
        raise ValueError(f"unknown launcher {launcher!r} for the task shim (one of {', '.join(LAUNCHERS)})")
    return f"torchhpc-task-{launcher}"


def task_argv(command: Sequence[str], shim: str = TASK_SHIM, launcher: str | None = None) -> list[str]:
    """Wrap one rank's command in the shim: ``bash -c SHIM torchhpc-task[-LAUNCHER] CMD...``.

    Pass ``shim=Raw('"$_torchhpc_task_shim"')`` when the script defines it once.
    Name the ``launcher`` so stale variables of another launcher can never win.
    """
    return ["bash", "-c", shim, shim_name(launcher), *command]
