#!/bin/bash
# torchhpc's per-task shim: torch's env:// contract (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
# GROUP_RANK, NODE_RANK, MASTER_ADDR, MASTER_PORT) from the launcher's own variables, then exec.
# Usage: bash task.sh srun|mpirun|torchrun|auto COMMAND...  (auto: MPI first, then Slurm, else one process)
# Every rank/world variable a known detector reads describes this process or is unset: SLURM_* of a
# launcher's step rewritten, foreign OMPI_*/PMI_*/MV2_* and TORCHELASTIC_* unset (docs/compat.md).
# Plain bash: it runs inside containers that have no torchhpc (src/torchhpc/launchers/boot.py: task_argv).
set -e
_torchhpc_launcher=${1:?torchhpc-task: usage: task.sh srun|mpirun|torchrun|auto COMMAND...}; shift
if [ "$_torchhpc_launcher" = auto ]; then
  if [ -n "${OMPI_COMM_WORLD_RANK:-}" ] || [ -n "${PMI_RANK:-}" ]; then _torchhpc_launcher=mpirun
  elif [ -n "${SLURM_PROCID:-}" ]; then _torchhpc_launcher=srun
  else _torchhpc_launcher=none; fi
fi
case $_torchhpc_launcher in
torchrun)
  if [ -z "${TORCHELASTIC_RUN_ID:-}" ] || [ -z "${LOCAL_RANK:-}" ] || [ -z "${RANK:-}" ]; then
    echo "torchhpc-task: started for torchrun, but RANK/LOCAL_RANK/TORCHELASTIC_RUN_ID are not set" >&2; exit 2
  fi
  : "${LOCAL_WORLD_SIZE:=1}" "${GROUP_RANK:=$((RANK / LOCAL_WORLD_SIZE))}" ;;
mpirun)
  if [ -n "${OMPI_COMM_WORLD_RANK:-}" ]; then
    RANK=$OMPI_COMM_WORLD_RANK WORLD_SIZE=$OMPI_COMM_WORLD_SIZE
    LOCAL_RANK=${OMPI_COMM_WORLD_LOCAL_RANK:-0} LOCAL_WORLD_SIZE=${OMPI_COMM_WORLD_LOCAL_SIZE:-1}
  elif [ -n "${PMI_RANK:-}" ]; then
    RANK=$PMI_RANK WORLD_SIZE=$PMI_SIZE
    LOCAL_RANK=${MPI_LOCALRANKID:-${PALS_LOCAL_RANKID:-0}} LOCAL_WORLD_SIZE=${MPI_LOCALNRANKS:-${PALS_LOCAL_SIZE:-1}}
  else
    echo "torchhpc-task: started for mpirun, but neither OMPI_COMM_WORLD_RANK nor PMI_RANK is set" >&2; exit 2
  fi
  GROUP_RANK=$((RANK / LOCAL_WORLD_SIZE)) ;;
srun)
  if [ -z "${SLURM_PROCID:-}" ]; then echo "torchhpc-task: started for srun, but SLURM_PROCID is not set" >&2; exit 2; fi
  RANK=$SLURM_PROCID WORLD_SIZE=${SLURM_STEP_NUM_TASKS:-${SLURM_NTASKS:-1}} LOCAL_RANK=${SLURM_LOCALID:-0} LOCAL_WORLD_SIZE=1 _torchhpc_i=0
  IFS=, read -ra _torchhpc_groups <<< "${SLURM_STEP_TASKS_PER_NODE:-${SLURM_TASKS_PER_NODE:-1}}"
  for _torchhpc_g in "${_torchhpc_groups[@]}"; do
    _torchhpc_n=${_torchhpc_g%%(*} _torchhpc_r=1
    case $_torchhpc_g in *"(x"*) _torchhpc_r=${_torchhpc_g#*(x} _torchhpc_r=${_torchhpc_r%)} ;; esac
    if [ "${SLURM_NODEID:-0}" -lt $((_torchhpc_i + _torchhpc_r)) ]; then LOCAL_WORLD_SIZE=$_torchhpc_n; break; fi
    _torchhpc_i=$((_torchhpc_i + _torchhpc_r))
  done
  GROUP_RANK=${SLURM_NODEID:-$((RANK / LOCAL_WORLD_SIZE))} ;;
none)
  RANK=${RANK:-0} WORLD_SIZE=${WORLD_SIZE:-1} LOCAL_RANK=${LOCAL_RANK:-0} LOCAL_WORLD_SIZE=${LOCAL_WORLD_SIZE:-1}
  GROUP_RANK=$((RANK / LOCAL_WORLD_SIZE)) ;;
*) echo "torchhpc-task: unknown launcher '$_torchhpc_launcher' (srun, mpirun, torchrun or auto)" >&2; exit 2 ;;
esac
for _torchhpc_p in OMPI_COMM_WORLD_ PMI_ MV2_COMM_WORLD_; do
  _torchhpc_r=${_torchhpc_p}RANK _torchhpc_s=${_torchhpc_p}SIZE
  if [ -n "${!_torchhpc_r:-}${!_torchhpc_s:-}" ] && [ "${!_torchhpc_r:-}:${!_torchhpc_s:-}" != "$RANK:$WORLD_SIZE" ]; then
    case $_torchhpc_p in PMI_) unset PMI_RANK PMI_SIZE ;; OMPI_*) unset "${!OMPI_COMM_WORLD_@}" ;; *) unset "${!MV2_COMM_WORLD_@}" ;; esac
  fi
done
if [ "$_torchhpc_launcher" != torchrun ]; then
  for _torchhpc_v in "${!TORCHELASTIC_@}"; do unset "$_torchhpc_v"; done
  unset ROLE_RANK ROLE_NAME ROLE_WORLD_SIZE GROUP_WORLD_SIZE
fi
if [ "$_torchhpc_launcher" != srun ] && [ -n "${SLURM_PROCID:-}" ]; then
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
if [ "$_torchhpc_launcher" != torchrun ]; then
  if [ -n "${TORCHHPC_GPU_PER_TASK:-}" ]; then
    IFS=, read -ra _torchhpc_l <<< "${!TORCHHPC_GPU_PER_TASK:-}"
    export "$TORCHHPC_GPU_PER_TASK=${_torchhpc_l[$LOCAL_RANK]:-$LOCAL_RANK}"
  fi
fi
if [ "$_torchhpc_launcher" = mpirun ]; then
  if [ -n "${TORCHHPC_CPU_MASKS:-}" ]; then
    IFS=, read -ra _torchhpc_l <<< "$TORCHHPC_CPU_MASKS"
    taskset -p "${_torchhpc_l[$((LOCAL_RANK % ${#_torchhpc_l[@]}))]}" $$ >/dev/null 2>&1 \
      || echo "torchhpc-task: rank $RANK: taskset could not apply a mask of TORCHHPC_CPU_MASKS" >&2
  fi
fi
: "${MASTER_ADDR:=127.0.0.1}" "${MASTER_PORT:=29500}"
export RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK MASTER_ADDR MASTER_PORT
export NODE_RANK=$GROUP_RANK
if [ -n "${TORCHHPC_BOOT_DIR:-}" ] && [ "${TORCHHPC_EXIT_CURE:-1}" != 0 ]; then export PYTHONPATH="$TORCHHPC_BOOT_DIR${PYTHONPATH:+:$PYTHONPATH}"; fi
if [ -n "${TORCHHPC_WARM_STANDBY:-}" ] && [ -f "${TORCHHPC_BOOT_DIR:-}/warm.py" ]; then  # a restart: a standby has torch imported
  if [ "$1" = "${TORCHHPC_WARM_PYTHON:-}" ]; then exec "$1" -I -S "$TORCHHPC_BOOT_DIR/warm.py" run "$@"; fi
  echo "torchhpc: warm start: $1 is not the standby's Python: cold start" >&2
fi
exec "$@"
