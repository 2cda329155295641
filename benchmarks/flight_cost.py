"""What the Flight Recorder costs per collective: gloo all_reduce with it on (torchhpc's default
boot, 2000 entries) and off (``--flight-recorder off``), interleaved round by round.

Each round starts 2 local ranks (``torchhpc run -n 2``); each rank times ``--calls`` back-to-back
all_reduce calls of ``--bytes`` bytes after a warm-up, as nccl-tests times them (mean time of
back-to-back calls). Prints per round the µs per call of each, then the medians, their difference
and ratio, and the load average. Run: ``.venv/bin/python benchmarks/flight_cost.py [--rounds 7]``.
No timed assertions: the figure goes to docs/diagnose.md.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

RANK = r'''
import os, sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(max(1, int(sys.argv[2]) // 4))
for _ in range(200):
    dist.all_reduce(t)
dist.barrier()
t0 = time.perf_counter()
for _ in range(int(sys.argv[1])):
    dist.all_reduce(t)
us = (time.perf_counter() - t0) / int(sys.argv[1]) * 1e6
if dist.get_rank() == 0:
    print(f"US_PER_CALL {us:.2f} FR={os.environ.get('TORCH_FR_BUFFER_SIZE', 'unset')}", flush=True)
dist.destroy_process_group()
'''


def one(fr: str, calls: int, size: int, prog: str) -> float:
    argv = [sys.executable, "-m", "torchhpc", "run", "-n", "2", "--flight-recorder", fr, prog, str(calls), str(size)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    m = re.search(r"US_PER_CALL (\S+) FR=(\S+)", out.stdout)
    if not m:
        raise SystemExit(f"no figure from {' '.join(argv)}:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    want = "unset" if fr == "off" else fr
    if m.group(2) != want:
        raise SystemExit(f"the rank saw TORCH_FR_BUFFER_SIZE={m.group(2)}, not {want}")
    return float(m.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--bytes", type=int, default=4)
    a = ap.parse_args()
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(RANK)
    rows: dict[str, list[float]] = {"2000": [], "off": []}
    try:
        print(f"# gloo all_reduce, {a.bytes} B, 2 local ranks, {a.calls} back-to-back calls per round")
        print(f"# {'round':>5} {'on (us)':>10} {'off (us)':>10}")
        for r in range(a.rounds):
            for fr in (("2000", "off") if r % 2 == 0 else ("off", "2000")):
                rows[fr].append(one(fr, a.calls, a.bytes, f.name))
            print(f"  {r + 1:>5} {rows['2000'][-1]:>10.1f} {rows['off'][-1]:>10.1f}")
    finally:
        os.unlink(f.name)
    on, off = statistics.median(rows["2000"]), statistics.median(rows["off"])
    print(f"# median: on {on:.1f} us, off {off:.1f} us per call; on - off = {on - off:+.1f} us; on/off = {on / off:.3f}")
    print(f"# load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
