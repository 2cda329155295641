#!/bin/bash
# golden: torchhpc.containers.wrap() for --runtime pyxis (case pyxis_ngc);
# checked against the runtime's documented syntax (it cannot be installed on the dev machine)
#SBATCH --container-image=nvcr.io\#nvidia/pytorch:24.03-py3
#SBATCH --container-mounts=/scratch/data:/data:ro,/home/user/project:/home/user/project
#SBATCH --container-workdir=/home/user/project
#SBATCH --container-env=NCCL_DEBUG
#SBATCH --container-name=pt2403
#SBATCH --no-container-mount-home
srun '--container-image=nvcr.io#nvidia/pytorch:24.03-py3' --container-mounts=/scratch/data:/data:ro,/home/user/project:/home/user/project --container-workdir=/home/user/project --container-env=NCCL_DEBUG --container-name=pt2403 --no-container-mount-home bash -c 'exec "$@"' torchhpc-task python train.py --lr 0.1
