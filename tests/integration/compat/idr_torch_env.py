"""idr_torch, as its docs show: rank and world from the launcher it detects."""

import idr_torch
import torch
import torch.distributed as dist

idr_torch.init_process_group(backend="gloo")
t = torch.tensor([float(idr_torch.rank + 1)])
dist.all_reduce(t)
print(
    f"COMPAT row=idr_torch rank={idr_torch.rank} world={idr_torch.world_size} sum={t.item():g} "
    f"via={idr_torch.current_API}:local={idr_torch.local_rank}",
    flush=True,
)
dist.destroy_process_group()
