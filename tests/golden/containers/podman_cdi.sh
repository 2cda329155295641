#!/bin/bash
# golden: torchhpc.containers.wrap() for --runtime podman (case podman_cdi);
# checked against the runtime's documented syntax (it cannot be installed on the dev machine; it also runs for real in tests/integration)
bash "$TORCHHPC_BOOT_DIR/gpus.sh" podman 35 podman --root /var/tmp/podman/root --runroot /var/tmp/podman/run --cgroup-manager=cgroupfs --events-backend=file run --rm --ipc=host --network=host --uts=host --ulimit memlock=-1 --ulimit stack=67108864 --pull=never -v /scratch/data:/data:ro -v /home/user/project:/home/user/project -w /home/user/project -e MASTER_ADDR -e MASTER_PORT -e 'SLURM_*' -e 'PMIX_*' -e 'OMPI_*' -e NCCL_DEBUG=INFO nvcr.io/nvidia/pytorch:24.03-py3 bash -c 'exec "$@"' torchhpc-task python train.py --lr 0.1
