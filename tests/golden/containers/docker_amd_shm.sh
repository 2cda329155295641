#!/bin/bash
# golden: torchhpc.containers.wrap() for --runtime docker (case docker_amd_shm);
# checked against the runtime's documented syntax (it cannot be installed on the dev machine)
docker run --rm --device /dev/kfd --device /dev/dri --group-add video --ipc=private --network=host --uts=host --ulimit memlock=-1 --ulimit stack=67108864 --shm-size=16g -v /scratch/data:/data:ro -v /home/user/project:/home/user/project -w /home/user/project -e MASTER_ADDR -e MASTER_PORT rocm/pytorch:latest bash -c 'exec "$@"' torchhpc-task python train.py --lr 0.1
