#!/bin/bash
# golden: torchhpc.containers.wrap() for --runtime docker (case docker_seed000);
# checked against the runtime's documented syntax (it cannot be installed on the dev machine)
bash "$TORCHHPC_BOOT_DIR/gpus.sh" docker 27 bash "$TORCHHPC_BOOT_DIR/env.sh" flag -e 3 'SLURM_*' 'PMIX_*' 'OMPI_*' 18 docker run --rm --ipc=host --network=host --uts=host --ulimit memlock=-1 --ulimit stack=67108864 -v /home/user/project:/home/user/project -w /home/user/project -e MASTER_ADDR -e MASTER_PORT mn5 bash -c 'exec "$@"' torchhpc-task python train.py --lr 0.1
