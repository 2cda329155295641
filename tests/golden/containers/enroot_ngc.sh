#!/bin/bash
# golden: torchhpc.containers.wrap() for --runtime enroot (case enroot_ngc);
# checked against the runtime's documented syntax (it cannot be installed on the dev machine)
[ -f pytorch+24.03-py3.sqsh ] || enroot import --output pytorch+24.03-py3.sqsh 'docker://nvcr.io#nvidia/pytorch:24.03-py3'
enroot list | grep -qxF pytorch+24.03-py3 || enroot create --name pytorch+24.03-py3 pytorch+24.03-py3.sqsh
bash "$TORCHHPC_BOOT_DIR/env.sh" flag --env 3 'SLURM_*' 'PMIX_*' 'OMPI_*' 13 enroot start --rw --mount /scratch/data:/data:none:x-create=auto,rbind,ro --mount /home/user/project:/home/user/project --env MASTER_ADDR --env MASTER_PORT --env NCCL_DEBUG=INFO pytorch+24.03-py3 sh -c 'cd "$1" || exit 1; shift; exec "$@"' torchhpc-cd /home/user/project bash -c 'exec "$@"' torchhpc-task python train.py --lr 0.1
