"""Train small DDP and FSDP2 models under ``torchhpc run -n W``, checkpointing with torchhpc.dist.checkpoint.

usage: ckpt_dcp.py ROOT train|resume [--from DIR] [--steps 5] [--save-at 3] [--legacy] [--kinds K,K:DIR]

Each kind (``ddp-sync``, ``ddp-async``, ``fsdp-sync``, ``fsdp-async``) trains its own
model in ``ROOT/<kind>/``. ``train``: steps 0..steps, saving at ``--save-at``
(blocking or not, by kind; with ``--legacy`` also an old single-file checkpoint of
the DDP model in ``ROOT/legacy/``). ``resume``: restore from ``--from`` (default ROOT,
the same run's checkpoints; another run's for resharding) and train on to ``--steps``;
``--kinds fsdp-sync:legacy`` resumes that kind's model from ``ROOT/legacy``, dumped as ``fsdp-sync-legacy``.

The ranks train on their device (``thd.init()``'s: CPU and gloo here, their CUDA device and NCCL on
a GPU, where benchmarks/gpu_checkpoint.py runs this script); inputs and noise come from the CPU RNG.
Rank 0 writes the full (unsharded) model and optimizer state after the save step and
at the end: ``ROOT/<kind>.<train|resume>.<step>.pt``, so a test compares runs and worlds
with ``torch.equal``. Data per step come from a generator seeded by (step, rank), noise
and dropout from the global RNG (a lost RNG state would show), Adam (a lost optimizer
state would show).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

import torchhpc.dist as thd
from torchhpc.dist import checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the checkout: tests/legacy_checkpoint.py
from tests import legacy_checkpoint

p = argparse.ArgumentParser()
p.add_argument("root")
p.add_argument("mode", choices=("train", "resume"))
p.add_argument("--from", dest="source", default=None)
p.add_argument("--steps", type=int, default=5)
p.add_argument("--save-at", type=int, default=3)
p.add_argument("--legacy", action="store_true")
p.add_argument("--kinds", default="ddp-sync,ddp-async,fsdp-sync,fsdp-async")
a = p.parse_args()
root = Path(a.root)
ctx = thd.init(single_group=True)  # a group even for one rank (DDP and FSDP2 want one; one GPU: -n 1)
rank, dev = ctx.rank, ctx.device
torch.manual_seed(100 + rank)  # per-rank global RNG: dropout and noise differ by rank


def build(kind: str) -> tuple[Any, Any, Any]:
    g = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Dropout(0.1), nn.Linear(32, 24), nn.Tanh(), nn.Linear(24, 1))
    with torch.no_grad():  # identical start on every rank, independent of the per-rank seed
        for prm in model.parameters():
            prm.copy_(torch.randn(prm.shape, generator=g) * 0.2)
    model.to(dev)
    if kind.startswith("fsdp"):
        for child in model.children():
            if any(True for _ in child.parameters()):
                fully_shard(child)
        fully_shard(model)
        fwd = model
    else:
        # find_unused_parameters: DDP keeps its first buckets (no rebuild after step 1, which a resumed
        # run would do anew): with 3+ ranks the gradient sums keep their order, so runs match bit for bit.
        fwd = DDP(model, find_unused_parameters=True)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    return model, fwd, opt


def step_once(step: int, fwd: Any, opt: Any) -> None:
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(8, 16, generator=g)
    y = (x.sum(1, keepdim=True) + torch.randn(8, 1) * 0.01).to(dev)
    x = x.to(dev)
    loss = ((fwd(x) - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()


def dump(kind: str, step: int, model: Any, opt: Any) -> None:
    msd, osd = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        torch.save({"model": msd, "optim": osd, "rng": torch.get_rng_state()}, root / f"{kind}.{a.mode}.{step}.pt")


for spec in a.kinds.split(","):
    # KIND, or KIND:DIR to resume KIND's model from another directory (e.g. fsdp-sync:legacy)
    kind, _, where = spec.partition(":")
    model, fwd, opt = build(kind)
    start = 0
    if a.mode == "resume":
        state = checkpoint.resume(Path(a.source or root) / (where or kind), model=model, optimizer=opt)
        assert state.get("step") == a.save_at and state.get("epoch") == 7, (spec, state)
        start = state["step"]
        kind = f"{kind}-{where}" if where else kind
        dump(kind, start, model, opt)
    for step in range(start, a.steps):
        step_once(step, fwd, opt)
        if a.mode == "train" and step + 1 == a.save_at:
            dump(kind, step + 1, model, opt)
            r = checkpoint.save(root / kind, step=step + 1, model=model, optimizer=opt,
                                blocking=not kind.endswith("async"), epoch=7)
            if a.legacy and kind == "ddp-sync":
                legacy_checkpoint.save(root / "legacy", step=step + 1, model=fwd, optimizer=opt, epoch=7)
            if rank == 0:
                print(f"saved {kind} step {step + 1}: {r}", flush=True)
    dump(kind, a.steps, model, opt)
checkpoint.wait()
if rank == 0:
    print("DONE", flush=True)
thd.cleanup()
