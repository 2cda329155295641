#!/bin/bash
# golden: torchhpc.containers.wrap() for --runtime apptainer (case apptainer_rocm_cleanenv);
# checked against the runtime's documented syntax (it cannot be installed on the dev machine)
_torchhpc_sif="${TORCHHPC_SIF_CACHE:-$HOME/.cache/torchhpc/sif}"/rocm_pytorch_latest.sif
if [ ! -f "$_torchhpc_sif" ]; then
  mkdir -p "${_torchhpc_sif%/*}"
  apptainer build "$_torchhpc_sif.$$.tmp" docker://rocm/pytorch:latest \
    || { echo 'torchhpc: apptainer build of docker://rocm/pytorch:latest failed' >&2; exit 1; }
  mv -f "$_torchhpc_sif.$$.tmp" "$_torchhpc_sif"
fi
bash "$TORCHHPC_BOOT_DIR/env.sh" export APPTAINERENV_ 6 MASTER_ADDR MASTER_PORT 'SLURM_*' 'PMIX_*' 'OMPI_*' MIOPEN_USER_DB_PATH 0 env APPTAINERENV_NCCL_DEBUG=INFO apptainer exec --rocm --cleanenv --writable-tmpfs "${TORCHHPC_SIF_CACHE:-$HOME/.cache/torchhpc/sif}"/rocm_pytorch_latest.sif bash -c 'exec "$@"' torchhpc-task python train.py --lr 0.1
