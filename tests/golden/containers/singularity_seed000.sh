#!/bin/bash
# golden: torchhpc.containers.wrap() for --runtime singularity (case singularity_seed000);
# checked against the runtime's documented syntax (it cannot be installed on the dev machine)
singularity exec --nv --bind /home/upc/upc580327/MN5-Distributed-PyTorch MN5-NGC-PyTorch-24.03.sif bash -c 'exec "$@"' torchhpc-task python train.py --lr 0.1
