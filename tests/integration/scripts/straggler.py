"""A gloo job whose rank SLOW computes 10x longer per step than the others, with an all_reduce every
step (synchronous training's shape); rank 0 shows a tqdm bar. ``torchhpc top`` must name SLOW.

usage: straggler.py SLOW [STEPS] [STEP_S]
"""

import sys
import time

import torch
import torch.distributed as dist
from tqdm import tqdm


def compute(seconds: float) -> float:
    """Busy for ``seconds`` of wall time: the step's own work, in the user's code."""
    x, end = 1.0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        x = x * 1.000001 + 1e-9
    return x


dist.init_process_group("gloo")
rank = dist.get_rank()
slow = int(sys.argv[1])
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 600
step_s = float(sys.argv[3]) if len(sys.argv) > 3 else 0.02
t = torch.ones(1)
for _ in tqdm(range(steps), disable=rank != 0, mininterval=0.5):
    compute(step_s * (10 if rank == slow else 1))
    dist.all_reduce(t)
print(f"rank {rank} done", flush=True)
