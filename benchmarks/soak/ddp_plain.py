"""Plain DDP as torch's tutorial writes it (no torchhpc import): env:// init, 20 steps, no destroy at the end.

A soak cell of benchmarks/soak_compat.py: the gloo exit race (issue 29) hits scripts like this one.
"""

import os

import torch
import torch.distributed as dist

dist.init_process_group(backend="gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Linear(64, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(20):
    opt.zero_grad()
    x = torch.randn(16, 32)
    torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
    opt.step()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
print(f"COMPAT row=ddp_plain rank={rank} world={world} sum={t.item():g} via=env:// local={os.environ.get('LOCAL_RANK')}",
      flush=True)
