"""A gloo job whose rank HANG_RANK sleeps before the all_reduce the others wait in, on the first
attempt only (``TORCHHPC_RESTART_COUNT`` 0), or on every attempt with ``always``.

usage: hang_once.py HANG_RANK [always]
"""

import os
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
attempt = int(os.environ.get("TORCHHPC_RESTART_COUNT", "0"))
print(f"rank {rank} attempt {attempt} elastic {os.environ.get('TORCHELASTIC_RESTART_COUNT')}", flush=True)
if rank == int(sys.argv[1]) and (attempt == 0 or sys.argv[2:] == ["always"]):
    time.sleep(3600)  # the planted hang
t = torch.ones(1)
dist.all_reduce(t)
print(f"rank {rank} done at attempt {attempt}", flush=True)
dist.destroy_process_group()
