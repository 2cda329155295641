#!/bin/bash
# golden: torchhpc.containers.wrap() for --runtime apptainer (case apptainer_nv_binds);
# checked against the runtime's documented syntax (it cannot be installed on the dev machine)
apptainer exec --nv --bind /scratch/data:/data:ro --bind /scratch/out:/out --pwd /workspace /scratch/images/pytorch.sif bash -c 'exec "$@"' torchhpc-task python train.py --lr 0.1
