#!/bin/bash
# golden: torchhpc.containers.wrap() for --runtime enroot (case enroot_sqsh_direct);
# checked against the runtime's documented syntax (it cannot be installed on the dev machine)
enroot start --mount /home/user/project:/home/user/project --env MASTER_ADDR --env RANK /scratch/images/pytorch.sqsh sh -c 'cd "$1" || exit 1; shift; exec "$@"' torchhpc-cd /home/user/project bash -c 'exec "$@"' torchhpc-task python train.py --lr 0.1
