"""A script that reads Open MPI's variables itself, as seed 003's mpirun + python helper does."""

import os

import torch
import torch.distributed as dist

rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
world_size = int(os.environ["OMPI_COMM_WORLD_SIZE"])
local_rank = int(os.environ["OMPI_COMM_WORLD_LOCAL_RANK"])
dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world_size)
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
print(f"COMPAT row=ompi_vars rank={rank} world={world_size} sum={t.item():g} via=OMPI_COMM_WORLD_RANK:local={local_rank}", flush=True)
dist.destroy_process_group()
