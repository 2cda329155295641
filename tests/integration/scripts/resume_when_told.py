"""A script that resumes only when told (accelerate's idiom): the first attempt saves two
checkpoints and fails with a network error; a later one must get ``--resume_from_checkpoint DIR``.

usage: resume_when_told.py [--resume_from_checkpoint DIR]
"""

import os
import sys
import time

attempt = int(os.environ.get("TORCHHPC_RESTART_COUNT", "0"))
print(f"attempt {attempt} argv {sys.argv[1:]}", flush=True)
if attempt == 0:
    for step in (5, 10):
        os.makedirs(f"ckpt/checkpoint-{step}", exist_ok=True)
        time.sleep(0.05)  # the newer one has the newer time
    print("torch.distributed.DistNetworkError: planted", file=sys.stderr, flush=True)
    sys.exit(1)
if sys.argv[1:] != ["--resume_from_checkpoint", "ckpt/checkpoint-10"]:
    sys.exit(f"not told where to resume: {sys.argv[1:]}")
print("resumed from ckpt/checkpoint-10", flush=True)
