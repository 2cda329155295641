"""A script that reads Slurm's task variables itself, as the seeds' srun scripts do."""

import os

import torch
import torch.distributed as dist

rank = int(os.environ["SLURM_PROCID"])
world_size = int(os.environ["SLURM_NTASKS"])
local_rank = int(os.environ["SLURM_LOCALID"])
dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world_size)
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
print(f"COMPAT row=slurm_vars rank={rank} world={world_size} sum={t.item():g} via=SLURM_PROCID:local={local_rank}", flush=True)
dist.destroy_process_group()
