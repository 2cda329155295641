"""The rank program of ``benchmarks/recovery.py --parts``: gloo all_reduce steps, with a line at
each stage of its start so the benchmark can split a restart into its parts.

Rank 0 prints ``UP`` (the interpreter runs), ``IMPORTED`` (torch imported), ``RDZV`` (the process
group is up) and ``STEP n`` each step, each with the attempt and the time.
"""

import os
import sys
import time

restart = os.environ.get("TORCHHPC_RESTART_COUNT", "0")
rank = next((os.environ[v] for v in ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK") if v in os.environ), "0")


def say(text: str) -> None:
    if rank == "0":
        print(f"{text} restart={restart} t={time.time():.3f}", flush=True)


say("UP")
import torch  # noqa: E402  (timed: the import is a part of the start)

say("IMPORTED")
import torchhpc.dist as thd  # noqa: E402

ctx = thd.init()
say("RDZV")
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 60
for step in range(steps):
    t = torch.ones(1)
    torch.distributed.all_reduce(t)
    say(f"STEP {step}")
    time.sleep(0.1)
torch.distributed.destroy_process_group()
