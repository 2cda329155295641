"""DDP that goes on after a node loss on fewer nodes: the same global batch, every sample once.

    torchhpc run -n 2 examples/elastic_ddp.py --steps 40
    torchhpc run --scheduler slurm --nodes 3 --min-nodes 2 --nproc-per-node 2 --max-restarts 2 \\
        --launcher srun examples/elastic_ddp.py --steps 200 --ckpt ckpt/

The three helpers a program needs to survive a change of world size (docs/resilience.md):

* ``thd.accumulation(global_batch, micro_batch)``: micro-batches per rank per optimizer step on this
  world, so the optimizer always sees ``--global-batch`` samples (refused at start if it cannot);
* ``checkpoint.save(..., loader=data)`` / ``checkpoint.resume(..., loader=data)``: the model and
  optimizer reshard (DCP), and the data goes on from the job's place in the epoch, dealt to the ranks
  that are left;
* ``TORCHHPC_DATA_LEDGER=FILE``: every rank writes the samples it was handed (``thd.read_ledger``).

The data is a fixed regression set (``--samples`` rows, seeded), so two runs on different worlds that
take the same samples in the same optimizer steps reach the same loss up to the order of the sums.
Rank 0 prints ``step N loss L world W restart R`` and, at the end, ``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.nn as nn

import torchhpc.dist as thd
from torchhpc.dist import checkpoint

p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
p.add_argument("--steps", type=int, default=40, help="optimizer steps in all")
p.add_argument("--global-batch", type=int, default=48, help="samples per optimizer step, on any world size")
p.add_argument("--micro-batch", type=int, default=2, help="samples per rank per forward/backward")
p.add_argument("--samples", type=int, default=960, help="rows of the data set (an epoch)")
p.add_argument("--ckpt", default=None, metavar="DIR", help="checkpoint directory (resumed from when it has one)")
p.add_argument("--ckpt-every", type=int, default=10, help="optimizer steps between checkpoints")
p.add_argument("--sleep", type=float, default=0.0, help="seconds added to each step (to place a fault)")
p.add_argument("--out", default=None, metavar="FILE", help="rank 0 writes the final loss and parameters here")
a = p.parse_args()

ctx = thd.init()
rank, world = ctx.rank, ctx.world_size
restart = int(os.environ.get("TORCHHPC_RESTART_COUNT") or 0)
accum = thd.accumulation(a.global_batch, a.micro_batch)  # this world's micro-batches per step

g = torch.Generator().manual_seed(0)
x = torch.randn(a.samples, 16, generator=g)
y = x @ torch.randn(16, 1, generator=g) + 0.1 * torch.randn(a.samples, 1, generator=g)
model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
with torch.no_grad():
    for prm in model.parameters():
        prm.copy_(torch.randn(prm.shape, generator=g) * 0.2)
ddp = thd.wrap(model)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
data = thd.TensorLoader(torch.arange(a.samples), batch_size=a.micro_batch, seed=1, drop_last=True)

start = checkpoint.resume(a.ckpt, model=model, optimizer=opt, loader=data).get("step", 0) if a.ckpt else 0
if rank == 0:
    print(f"START step={start} world={world} accumulation={accum} restart={restart} t={time.time():.3f}", flush=True)


def batches():  # micro-batches across epochs: the loader starts the next epoch where the last one ended
    while True:
        yield from data


micro = batches()
loss_sum = torch.zeros(())
for step in range(start, a.steps):
    opt.zero_grad(set_to_none=True)
    loss_sum.zero_()
    for i in range(accum):
        (idx,) = next(micro)
        loss = ((ddp(x[idx]) - y[idx]) ** 2).mean() / accum
        if i < accum - 1:
            with ddp.no_sync():  # gradients meet once a step, after the last micro-batch
                loss.backward()
        else:
            loss.backward()
        loss_sum += loss.detach()
    opt.step()
    mean = thd.all_reduce_mean(loss_sum.clone())
    if rank == 0:
        print(f"step {step + 1} loss {float(mean):.8f} world {world} restart {restart} t={time.time():.3f}", flush=True)
    if a.sleep:
        time.sleep(a.sleep)
    if a.ckpt and (step + 1) % a.ckpt_every == 0:
        checkpoint.save(a.ckpt, step=step + 1, model=model, optimizer=opt, loader=data)
checkpoint.wait()
final = thd.all_reduce_mean(((model(x) - y) ** 2).mean().detach())
if rank == 0:
    result = {"loss": float(final), "steps": a.steps, "world": world, "restart": restart}
    if a.out:
        torch.save({"loss": float(final), "params": {k: v.clone() for k, v in model.state_dict().items()}}, a.out)
    print("RESULT " + json.dumps(result), flush=True)
thd.cleanup()
