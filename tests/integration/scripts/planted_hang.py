"""A gloo job whose rank HANG_RANK sleeps before the all_reduce the others wait in: a planted hang.

usage: planted_hang.py HANG_RANK
"""

import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
print(f"rank {rank} up", flush=True)
if rank == int(sys.argv[1]):
    time.sleep(3600)  # the planted hang: this line is the culprit's file:line
t = torch.ones(1)
dist.all_reduce(t)
print(f"rank {rank} done", flush=True)
