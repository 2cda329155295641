"""A small deterministic DDP training run for the nothing-lost scenarios.

Checkpoints every ``--ckpt-every`` steps and when ``should_stop()`` says so,
resumes from the newest checkpoint, and writes the final parameters. Data per
step come from a generator seeded by (step, rank), noise from the global RNG
(so a resume that lost RNG state would differ), SGD with momentum (so a lost
optimizer state would differ).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import torchhpc.dist as thd
from torchhpc.dist import checkpoint

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=40)
p.add_argument("--ckpt", required=True)
p.add_argument("--out", required=True)
p.add_argument("--sleep", type=float, default=0.0)
p.add_argument("--ckpt-every", type=int, default=1000)
p.add_argument("--kill-at", type=int, default=-1, help="rank 1 SIGKILLs itself at this step")
a = p.parse_args()

ctx = thd.init()
rank = ctx.rank
torch.manual_seed(1234 + rank)
model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
with torch.no_grad():  # identical start on every rank, independent of the per-rank seed
    g = torch.Generator().manual_seed(0)
    for prm in model.parameters():
        prm.copy_(torch.randn(prm.shape, generator=g) * 0.1)
ddp = DDP(model) if ctx.world_size > 1 else model
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
state = checkpoint.resume(a.ckpt, model=model, optimizer=opt)
start = int(state.get("step", 0))
restarts = os.environ.get("SLURM_RESTART_COUNT", "0")
if rank == 0:
    print(f"START step={start} restart={restarts} world={ctx.world_size} t={time.time():.3f}", flush=True)

for step in range(start, a.steps):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(8, 16, generator=g)
    y = x.sum(1, keepdim=True) + torch.randn(8, 1) * 0.01
    loss = ((ddp(x) - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    done = step + 1
    if rank == 1 and done == a.kill_at:
        print(f"KILLING rank 1 at step {done} t={time.time():.3f}", flush=True)
        os.kill(os.getpid(), 9)
    if done % a.ckpt_every == 0:
        checkpoint.save(a.ckpt, step=done, model=model, optimizer=opt)
    if thd.should_stop():
        checkpoint.save(a.ckpt, step=done, model=model, optimizer=opt)
        if rank == 0:
            print(f"STOPPED step={done} t={time.time():.3f}", flush=True)
        thd.cleanup()
        sys.exit(0)
    if rank == 0:
        print(f"step {done} loss {loss.item():.6f}", flush=True)
    time.sleep(a.sleep)

if rank == 0:
    torch.save(model.state_dict(), a.out)
    print(f"DONE step={a.steps} t={time.time():.3f}", flush=True)
thd.cleanup()
