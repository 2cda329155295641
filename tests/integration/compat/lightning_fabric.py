"""Lightning Fabric with its default cluster detection (no torchhpc import), as Lightning's docs show."""

import lightning as L
import torch

fabric = L.Fabric(accelerator="cpu", devices=2, num_nodes=2)
fabric.launch()
total = fabric.all_reduce(torch.tensor(float(fabric.global_rank + 1)), reduce_op="sum")
env = type(fabric._connector.cluster_environment).__name__
print(f"COMPAT row=lightning_fabric rank={fabric.global_rank} world={fabric.world_size} sum={total.item():g} via={env}", flush=True)
