"""A gloo job where rank BAD breaks the collective sequence in one of five ways: planted hangs for the
Flight Recorder verdict (docs/diagnose.md).

usage: planted_collective.py MODE BAD [OP]
  skip     rank BAD skips one OP (the others wait in it)
  gather   rank BAD calls all_gather where the others call OP
  size     rank BAD passes a tensor of another size to OP
  sleep    rank BAD sleeps in Python before the OP
  exit     rank BAD exits without destroy_process_group
  finish   no fault: every rank completes and exits without destroy_process_group (as the Hugging
           Face Trainer and accelerate scripts do), leaving exit dumps of a job that succeeded
OP: all_reduce (the default), all_gather (into one tensor, as accelerate's gather does) or
reduce_scatter; every collective of the run is that one.
"""

import os
import sys
import time

import torch
import torch.distributed as dist


def load_batch(seconds: float) -> None:
    time.sleep(seconds)  # the planted sleep: the culprit's file:line


mode, bad = sys.argv[1], int(sys.argv[2])
op = sys.argv[3] if len(sys.argv) > 3 else "all_reduce"
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()


def call(t: torch.Tensor) -> None:
    if op == "all_gather":
        dist.all_gather_into_tensor(torch.zeros(t.numel() * world), t)
    elif op == "reduce_scatter":
        dist.reduce_scatter_tensor(torch.zeros(t.numel()), torch.ones(t.numel() * world))
    else:
        dist.all_reduce(t)


print(f"rank {rank} up", flush=True)
t = torch.ones(4)
for _ in range(3):  # a few good collectives first: the sequence numbers are past 1
    call(t)
print(f"rank {rank} warm", flush=True)
if rank == bad and mode == "skip":
    pass
elif rank == bad and mode == "gather":
    dist.all_gather([torch.zeros(4) for _ in range(world)], t)
elif rank == bad and mode == "size":
    call(torch.ones(8))
elif rank == bad and mode == "sleep":
    load_batch(3600)
elif rank == bad and mode == "exit":
    sys.stdout.flush()
    os._exit(0) if os.environ.get("PLANTED_HARD_EXIT") else sys.exit(0)
else:
    call(t)
call(t)  # the skipping rank waits here, one collective ahead of nothing
time.sleep(3600) if rank == bad and mode == "skip" else None
print(f"rank {rank} done", flush=True)
if mode != "finish":
    dist.destroy_process_group()
