"""What ``torchhpc top`` costs the node it looks at: CPU of one look, and the slowdown of the ranks.

``top`` runs the node-side probe (``python -m torchhpc.observe.sample``) once per node per refresh
(every 2 s): /proc for CPU and memory, one ``py-spy record --nonblocking --idle`` per rank for 1 s.
This starts RANKS stand-in ranks here (plain Python, no torch: each alternates 20 ms of busy
work with 20 ms asleep, the shape of compute then a wait in a collective, and carries the
variables the probe matches), then, in interleaved rounds:

1. **cost of one look** (``top --once``): a fresh Python process, its own CPU and its py-spy
   children's (``RUSAGE_CHILDREN``), at each sampling rate; as a share of one core if it were
   repeated every 2 s. Also the same process finding no rank (Python start-up and /proc alone).
   **Cost of the live view**: its one stream process per node (``torchhpc.observe.stream``)
   over ``--live-s`` seconds, CPU over wall time.
2. **disturbance**: the ranks' work done (busy iterations per second) during a look against the
   same length of time without one, as a ratio (1.00 = untouched).

Goal (docs/observe.md): the live view <= 1 % of a core per node at the default rate with 4 ranks.
Run: ``.venv/bin/python benchmarks/top_probe.py [--ranks 4] [--rounds 5] [--rates 5,20]``.
On these shared 2-core machines absolute CPU moves with the load: quote medians and the spread.
Prints a table; no timed assertions.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from torchhpc.observe.stream import WINDOW_S

REFRESH_S = 2.0
RANK = r"""
import os, sys, time
out = sys.argv[1]
n = 0
while True:
    end = time.perf_counter() + 0.02
    while time.perf_counter() < end:
        n += 1
    time.sleep(0.02)
    with open(out + ".tmp", "w") as f:
        f.write(str(n))
    os.replace(out + ".tmp", out)  # whole numbers only for the reader
"""


def start_ranks(k: int, tmp: Path, run_id: str) -> list[subprocess.Popen[bytes]]:
    procs = []
    for r in range(k):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(k), TORCHELASTIC_RUN_ID=run_id)
        procs.append(subprocess.Popen([sys.executable, "-c", RANK, str(tmp / f"n{r}")], env=env))
    return procs


def work(tmp: Path, k: int) -> int:
    total = 0
    for r in range(k):
        try:
            total += int((tmp / f"n{r}").read_text() or 0)
        except (OSError, ValueError):
            pass
    return total


def look(run_id: str, rate: int) -> float:
    """CPU seconds of one look: the probe process and its py-spy children."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-m", "torchhpc.observe.sample", "--duration", "1", "--rate", str(rate),
                    f"TORCHELASTIC_RUN_ID={run_id}"], capture_output=True, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def stream(run_id: str, refreshes: int, rate: int) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of the live view's per-node stream over ``refreshes`` refreshes."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "torchhpc.observe.stream", "--every", str(REFRESH_S), "--count",
                    str(refreshes), "--rate", str(rate), f"TORCHELASTIC_RUN_ID={run_id}"], capture_output=True, check=True)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rates", default="5,20", help="py-spy samples per second to compare (top's default: 20)")
    ap.add_argument("--live-s", type=float, default=80.0, help="seconds of the live view's stream to measure")
    ap.add_argument("--live-rates", default="5", help="the live stream's py-spy rates to measure (top's: 5)")
    args = ap.parse_args()
    rates = [int(x) for x in args.rates.split(",")]
    run_id = f"bench-top-{os.getpid()}"
    cost: dict[str, list[float]] = {f"{r} Hz": [] for r in rates}
    cost["no rank found"] = []
    slow: dict[str, list[float]] = {f"{r} Hz": [] for r in rates}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        procs = start_ranks(args.ranks, tmp, run_id)
        try:
            time.sleep(1.0)
            for i in range(args.rounds):
                order = rates if i % 2 == 0 else rates[::-1]
                for rate in order:
                    w0, t0 = work(tmp, args.ranks), time.monotonic()
                    cpu = look(run_id, rate)
                    w1, t1 = work(tmp, args.ranks), time.monotonic()
                    time.sleep(0.1)
                    w2, t2 = work(tmp, args.ranks), time.monotonic()
                    time.sleep(t1 - t0)
                    w3, t3 = work(tmp, args.ranks), time.monotonic()
                    during, without = (w1 - w0) / (t1 - t0), (w3 - w2) / (t3 - t2)
                    cost[f"{rate} Hz"].append(cpu)
                    slow[f"{rate} Hz"].append(during / without if without else float("nan"))
                cost["no rank found"].append(look("nothing-matches-this", rates[0]))
            live = {int(r): stream(run_id, int(args.live_s / REFRESH_S), int(r)) for r in args.live_rates.split(",")}
        finally:
            for p in procs:
                p.kill()
                p.wait()
    print(f"# torchhpc top: one look at {args.ranks} ranks on this node (1 s of samples), {args.rounds} rounds, "
          f"refresh every {REFRESH_S:g} s")
    print(f"# {'variant':<14} {'cpu_s/look':>22} {'% of a core':>22} {'ranks work during/without':>26}")
    for key, vals in cost.items():
        pct = [100.0 * v / REFRESH_S for v in vals]
        ratio = slow.get(key, [])
        r = f"{statistics.median(ratio):.3f} ({min(ratio):.2f}-{max(ratio):.2f})" if ratio else "-"
        print(f"  {key:<14} {statistics.median(vals):>8.3f} ({min(vals):.3f}-{max(vals):.3f}) "
              f"{statistics.median(pct):>8.2f} ({min(pct):.2f}-{max(pct):.2f}) {r:>26}")
    for rate, (cpu, wall) in live.items():
        print(f"  {f'live {rate} Hz':<14} {cpu:>8.3f} CPU-s over {wall:.0f} s {100.0 * cpu / wall:>14.2f}  "
              f"(one stream per node for the session; py-spy windows of {WINDOW_S} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
