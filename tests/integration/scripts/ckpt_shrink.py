"""An FSDP2 run that saves its model, optimizer and data position, resumed on another world size.

usage: ckpt_shrink.py ROOT train|resume [--from DIR]

``train`` (3 nodes x 2 ranks in the test: 6 ranks): FSDP2 (``fully_shard``) trains on a TensorLoader of
96 samples, micro-batches of 2, a global batch of 48 (:func:`torchhpc.dist.accumulation`: 4 micro-batches a
rank on 6 ranks, 6 on 4, 3 on 8), and saves at global step 1 (mid-epoch: 48 of 96 samples) with ``loader=``. Rank 0 dumps the full model and optimizer
state there. ``resume`` (4 or 8 ranks): restores from ``--from``, dumps the full state as restored, and
writes each rank's next batch of sample indices, which the test checks against the epoch's order from the
saved position dealt by stride to the new world.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.distributed.fsdp import fully_shard

import torchhpc.dist as thd
from torchhpc.dist import checkpoint

p = argparse.ArgumentParser()
p.add_argument("root")
p.add_argument("mode", choices=("train", "resume"))
p.add_argument("--from", dest="source", default=None)
a = p.parse_args()
root = Path(a.root)
ctx = thd.init(single_group=True)
rank, world = ctx.rank, ctx.world_size
GLOBAL, MICRO, N = 48, 2, 96

g = torch.Generator().manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
with torch.no_grad():
    for prm in model.parameters():
        prm.copy_(torch.randn(prm.shape, generator=g) * 0.3)
for child in model.children():
    if any(True for _ in child.parameters()):
        fully_shard(child)
fully_shard(model)
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
xs = torch.randn(N, 8, generator=g)
ys = xs.sum(1, keepdim=True)
data = thd.TensorLoader(torch.arange(N), batch_size=MICRO, seed=3)
accum = thd.accumulation(GLOBAL, MICRO)


def dump(tag: str) -> None:
    msd, osd = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        torch.save({"model": msd, "optim": osd}, root / f"{tag}.pt")


if a.mode == "train":
    batches = iter(data)
    for _ in range(accum):  # global step 0: accum micro-batches per rank
        (idx,) = next(batches)
        loss = ((model(xs[idx]) - ys[idx]) ** 2).mean() / accum
        loss.backward()
    opt.step()
    opt.zero_grad()
    dump("saved")
    checkpoint.save(root / "ckpt", step=1, model=model, optimizer=opt, loader=data)
    if rank == 0:
        (root / "position.json").write_text(json.dumps(data.state_dict()))
else:
    state = checkpoint.resume(Path(a.source or root) / "ckpt", model=model, optimizer=opt, loader=data)
    assert state.get("step") == 1 and state.get("world_size") == 6, state
    dump(f"resumed-{world}")
    (idx,) = next(iter(data))
    (root / f"next-{world}-{rank}.json").write_text(json.dumps({"position": data.state_dict(), "next": idx.tolist(),
                                                                "accumulation": accum}))
checkpoint.wait()
if rank == 0:
    print("DONE", flush=True)
thd.cleanup()
