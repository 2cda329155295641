#!/bin/bash
runai submit-dist pytorch --name my-first-distributed-app --image registry.rcp.epfl.ch/meditron-ddx/basic:latest-solergib --workers 1 --gpu 4 --large-shm -- bash -c '"exec python -m torch.distributed.run --nnodes \"\$WORLD_SIZE\" --nproc-per-node 4 --node-rank \"\$RANK\" --master-addr \"\$MASTER_ADDR\" --master-port \"\$MASTER_PORT\" --max-restarts 0 --tee 3 examples/pi.py"'
