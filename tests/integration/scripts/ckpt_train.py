"""A small deterministic DDP training run for the nothing-lost scenarios.

Checkpoints every ``--ckpt-every`` steps and when ``should_stop()`` says so,
resumes from the newest checkpoint, and writes the final parameters. Data per
step come from a generator seeded by (step, rank), noise from the global RNG
(so a resume that lost RNG state would differ), SGD with momentum (so a lost
optimizer state would differ).

Rank 0 prints one line per event with the attempt (``SLURM_RESTART_COUNT``)
and a wall-clock time, so a test can tell which attempt reached which step::

    START step=S restart=R world=W pid=P t=T
    step N restart=R t=T
    STOPPED step=N restart=R t=T
    DONE step=N restart=R t=T

Fault hooks for the tests (each a real fault, not a simulation of its effect):
``--kill-at N`` makes rank 1 SIGKILL itself after step N; ``--slow-save-at N``
makes the fsync of step N's checkpoint take a minute (a slow shared
filesystem), so a test can SIGKILL rank 0 while the temporary file is half
written. ``--memory-every N`` saves to the memory tier (each node's shared memory, a peer's copy) between the disk saves.
``--sleep`` slows every step (``--sleep-first-attempt-only``: only
the first attempt, so a requeued run finishes before its own time-limit warning).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import timedelta
from typing import Any

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
p.add_argument("--sleep-first-attempt-only", action="store_true")
p.add_argument("--ckpt-every", type=int, default=1000)
p.add_argument("--memory-every", type=int, default=0, help="save to the memory tier every N steps (0: never)")
p.add_argument("--kill-at", type=int, default=-1, help="rank 1 SIGKILLs itself after this step")
p.add_argument("--slow-save-at", type=int, default=-1, help="rank 0's fsync of this step's checkpoint takes 60 s")
p.add_argument("--fixed-buckets", action="store_true",
               help="keep DDP's first gradient buckets (no rebuild after step 1): with more than 2 ranks a resumed "
                    "run must sum gradients in the same order as an uninterrupted one to end bit-identical")
p.add_argument("--pg-timeout", type=float, default=60.0, help="process-group timeout (s): a lost peer fails, not hangs")
a = p.parse_args()

restarts = int(os.environ.get("TORCHHPC_RESTART_COUNT") or os.environ.get("SLURM_RESTART_COUNT") or 0)
sleep = a.sleep if (restarts == 0 or not a.sleep_first_attempt_only) else 0.0
ctx = thd.init(timeout=timedelta(seconds=a.pg_timeout))
rank = ctx.rank


def say(text: str) -> None:
    if rank == 0:
        print(f"{text} restart={restarts} t={time.time():.3f}", flush=True)


torch.manual_seed(1234 + rank)
model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
with torch.no_grad():  # identical start on every rank, independent of the per-rank seed
    g = torch.Generator().manual_seed(0)
    for prm in model.parameters():
        prm.copy_(torch.randn(prm.shape, generator=g) * 0.1)
# find_unused_parameters: DDP never rebuilds its buckets then (the rebuild after the first step orders
# gradients by arrival, which a resumed run's first step sees anew: a different sum order on 3+ ranks).
ddp = DDP(model, find_unused_parameters=a.fixed_buckets) if ctx.world_size > 1 else model
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
state = checkpoint.resume(a.ckpt, model=model, optimizer=opt)
start = int(state.get("step", 0))
say(f"START step={start} world={ctx.world_size} pid={os.getpid()}")

_real_fsync = os.fsync


def _slow_fsync(fd: Any) -> None:
    say(f"SAVING slowly pid={os.getpid()}")
    time.sleep(60)
    _real_fsync(fd)


def save(step: int) -> None:
    if step == a.slow_save_at and rank == 0:
        os.fsync = _slow_fsync
    try:
        checkpoint.save(a.ckpt, step=step, model=model, optimizer=opt)
    finally:
        os.fsync = _real_fsync


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
        print(f"KILLING rank 1 pid={os.getpid()} at step {done} t={time.time():.3f}", flush=True)
        os.kill(os.getpid(), 9)
    if done % a.ckpt_every == 0:
        save(done)
    elif a.memory_every and done % a.memory_every == 0:
        checkpoint.save(a.ckpt, step=done, model=model, optimizer=opt, tier="memory")
    if thd.should_stop():
        save(done)
        say(f"STOPPED step={done}")
        thd.cleanup()
        sys.exit(0)
    say(f"step {done}")
    time.sleep(sleep)

if rank == 0:
    torch.save(model.state_dict(), a.out)
say(f"DONE step={a.steps}")
thd.cleanup()
