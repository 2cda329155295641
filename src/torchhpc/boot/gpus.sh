#!/bin/bash
# torchhpc's GPU prelude for docker and podman: the GPUs the scheduler gave this task, read when it starts.
# Usage: bash gpus.sh RUNTIME N HEAD(N words)... TAIL...  (the flags go between HEAD and TAIL)
# SLURM_STEP_GPUS / SLURM_JOB_GPUS hold the node's physical indices (what the daemon and CDI count);
# CUDA_VISIBLE_DEVICES is the fallback off Slurm. Never "all": the daemon sees another job's GPUs too.
rt=$1 n=$2
shift 2
pre=("${@:1:n}")
shift "$n"
g=${SLURM_STEP_GPUS:-${SLURM_JOB_GPUS:-${CUDA_VISIBLE_DEVICES:-}}}
if [ -z "$g" ] || [ "$g" = NoDevFiles ]; then
  echo "torchhpc: $rt: no GPU allocated to this task (SLURM_STEP_GPUS, SLURM_JOB_GPUS and CUDA_VISIBLE_DEVICES are empty)" >&2
  exit 2
fi
flags=()
if [ "$rt" = podman ]; then
  IFS=, read -ra ids <<< "$g"
  for i in "${ids[@]}"; do flags+=(--device "nvidia.com/gpu=$i"); done
else
  flags=(--gpus "\"device=$g\"")
fi
exec "${pre[@]}" "${flags[@]}" "$@"
