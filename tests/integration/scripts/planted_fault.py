"""A 2-node x 2-rank gloo job with one planted fault, for the diagnosis tests.

usage: planted_fault.py raise RANK | abort RANK
raise: RANK raises ValueError before the first all_reduce (the others then lose their peer);
abort: every rank finishes its all_reduce, then RANK calls os.abort() (SIGABRT), as a torch
thread's `terminate called` would.
"""

import os
import sys
import time

import torch
import torch.distributed as dist

mode, bad = sys.argv[1], int(sys.argv[2])
dist.init_process_group("gloo")
rank = dist.get_rank()
if mode == "raise" and rank == bad:
    time.sleep(1)
    raise ValueError(f"planted failure on rank {rank}")
t = torch.ones(1)
dist.all_reduce(t)
if mode == "abort" and rank == bad:
    os.abort()
print(f"rank {rank} done {t.item()}", flush=True)
