"""GPU proof of the Flight Recorder and top's GPU health (issue 45, part 6): run where a GPU is.

Starts a 1-rank NCCL job in the background (``torchhpc run -n 1 --background``) that runs a few
all_reduce calls on the GPU and then sits in Python; asks ``torchhpc top --once`` for its row (the
GPU_HEALTH column); asks the rank to dump its recorder into the job directory, as the hang watch
does (``diagnose.flight.request``/``collect``), and reads the dump back; cancels the job.
Prints what it saw; exit 1 if no dump came back. ``--backend gloo`` runs the same on a CPU.
Run: ``PYTHONPATH=src python3 benchmarks/gpu_flight.py``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

RANK = r'''
import sys, time, torch, torch.distributed as dist
backend = sys.argv[1]
dist.init_process_group(backend)
dev = "cuda" if backend == "nccl" else "cpu"
t = torch.ones(1 << 20, device=dev)
for _ in range(5):
    dist.all_reduce(t)
if dev == "cuda":
    torch.cuda.synchronize()
    x = torch.randn(8192, 8192, device=dev)
    end = time.time() + 20
    while time.time() < end:  # busy, so nvidia-smi lists the process
        x = x @ x
        x = x / x.norm()
    torch.cuda.synchronize()
print("ready", flush=True)
time.sleep(120)
'''


def tm(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "torchhpc", *args], capture_output=True, text=True, timeout=timeout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="nccl", choices=("nccl", "gloo"))
    a = ap.parse_args()
    from torchhpc.diagnose.flight import FR_DIR, analyse, collect, load_dumps, request
    from torchhpc.schedulers.local.jobs import job_dir

    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(RANK)
    sub = tm("run", "-n", "1", "--background", f.name, a.backend)
    m = re.search(r"Submitted local:(\S+)", sub.stdout)
    if not m:
        print(sub.stdout, sub.stderr)
        return 1
    jid = m.group(1)
    d = str(job_dir(jid))
    try:
        top_seen = ""
        for _ in range(120):
            time.sleep(1)
            if a.backend == "nccl" and not top_seen:
                top = tm("top", f"local:{jid}", "--once")
                if "GPU_HEALTH" in top.stdout:
                    top_seen = top.stdout
            log = open(os.path.join(d, "output.log")).read() if os.path.exists(os.path.join(d, "output.log")) else ""
            if "ready" in log:
                break
        print("== top --once while the rank computes on the GPU")
        print(top_seen or tm("top", f"local:{jid}", "--once").stdout)
        since = request(d) - 0.5
        dumps, _left = collect(d, 1, since, wait=10)
        print(f"== dumps in {os.path.join(d, FR_DIR)}: {sorted(os.listdir(os.path.join(d, FR_DIR)))}")
        if not dumps:
            print("no dump came back")
            return 1
        dump = dumps[0]
        print(f"version {dump.get('version')}, comm lib {dump.get('comm_lib_version')}, pg_status {dump.get('pg_status')}")
        for e in dump.get("entries", [])[-3:]:
            print({k: e.get(k) for k in ("collective_seq_id", "profiling_name", "input_sizes", "state", "retired")})
        print("analysis:", [x.line() for x in analyse(load_dumps(os.path.join(d, FR_DIR), "rank-"), 1)])
        return 0
    finally:
        tm("cancel", f"local:{jid}")
        os.unlink(f.name)


if __name__ == "__main__":
    raise SystemExit(main())
