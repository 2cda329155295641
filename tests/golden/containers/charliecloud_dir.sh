#!/bin/bash
# golden: torchhpc.containers.wrap() for --runtime charliecloud (case charliecloud_dir);
# checked against the runtime's documented syntax (it cannot be installed on the dev machine; it also runs for real in tests/integration)
ch-run --bind=/scratch/data:/data --bind=/home/user/project:/home/user/project --cd=/home/user/project --set-env=NCCL_DEBUG=INFO --env-no-expand /var/tmp/images/pytorch -- bash -c 'exec "$@"' torchhpc-task python train.py --lr 0.1
