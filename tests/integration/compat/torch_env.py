"""Plain torch, as its docs show: init_process_group() reads RANK/WORLD_SIZE/MASTER_* (env://)."""

import torch
import torch.distributed as dist

dist.init_process_group(backend="gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
print(f"COMPAT row=torch_env rank={rank} world={world} sum={t.item():g} via=env://", flush=True)
dist.destroy_process_group()
