"""A 2-rank gloo job whose ranks finish their work, then block at exit (issue 65, "done is done").

usage: exit_hang.py MODE [SECONDS]
  exit     every rank's program returns, then an atexit handler blocks SECONDS (default 60), as a stuck
           teardown does: the job has done its work and must end COMPLETED, with the hang-at-exit line
  before   rank 1 blocks SECONDS before its program returns: that is a hang, as before
"""

import atexit
import sys
import time

import torch
import torch.distributed as dist

mode = sys.argv[1]
seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 60.0
dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(4)
dist.all_reduce(t)
print(f"rank {rank} FINISHED sum={t[0]:.0f}", flush=True)
dist.destroy_process_group()


def stuck_teardown() -> None:
    time.sleep(seconds)  # where the hang-at-exit line must point


if mode == "exit":
    atexit.register(stuck_teardown)
elif mode == "before" and rank == 1:
    time.sleep(seconds)  # still in the program: a hang
