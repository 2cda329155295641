"""What each part of torchhpc's job machinery costs per job, measured alone, with and without it.

Interleaved rounds, medians (wall seconds) of each pair and their difference:

  task shim      a rank started through the per-task shim (bash) against started directly (``true``)
  log wrapper    through the per-rank log wrapper (bash, into a file) against directly
  boot file      ``python -c pass`` with the boot directory's sitecustomize first on PYTHONPATH, against without
  exit settle    a 1-rank gloo process group that exits without destroy: the exit cure's settle at exit
                 (TORCHHPC_EXIT_CURE=1) against none (=0); the time from its last line to its exit
  end marker     the batch script's EXIT trap writing <job dir>/end.json, against a script without it
  held submit    ``sbatch --hold`` + ``scontrol release`` against ``sbatch`` (the dev cluster; --cluster)

The stop protocol (traps, the step in the background) is only in scripts with --signal-before or
--requeue, not in the default job. Goal: every part <= 0.05 s per job (per rank where it runs per rank).

    python benchmarks/machinery_parts.py [--rounds 15] [--cluster]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from torchhpc.jobdir.endmark import end_lines, quoted_dir
from torchhpc.jobdir.log_wiring import LOG_WRAPPER
from torchhpc.launchers import TASK_SH
from torchhpc.launchers.boot import BOOT_DIR

GOAL = 0.05
GLOO = """import os, sys, time
import torch.distributed as dist
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%s" % sys.argv[1], rank=0, world_size=1)
print(repr(time.time()), flush=True)
"""


def timed(argv: list[str], env: dict[str, str] | None = None) -> float:
    t = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t


def settle_tail(env: dict[str, str], port: int) -> float:
    """From the program's last line to its exit, as its parent sees it."""
    p = subprocess.run([sys.executable, "-c", GLOO, str(port)], env=env, capture_output=True, text=True, check=True)
    end = time.time()
    return end - float(p.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--cluster", action="store_true", help="also the held submit on the dev cluster")
    args = ap.parse_args()
    base = dict(os.environ)
    slurm = {**base, "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
}
    with tempfile.TemporaryDirectory(prefix="machinery-") as d:
        work = Path(d)
        (work / "ranks").mkdir()
        (work / "j-1").mkdir()
        marked = work / "marked.sh"
        marked.write_text("\n".join(["set -euo pipefail", *end_lines(quoted_dir(str(work) + "/j-", "$JOBID")),
                                     "_torchhpc_end_arm", "true", ""]))
        plain = work / "plain.sh"
        plain.write_text("set -euo pipefail\ntrue\n")
        logged = {**base, "TORCHHPC_RANKS_DIR": str(work / "ranks")}
        booted = {**base, "PYTHONPATH": os.pathsep.join(filter(None, [str(BOOT_DIR), base.get("PYTHONPATH", "")]))}
        pairs: dict[str, tuple[Callable[[], float], Callable[[], float]]] = {
            "task shim": (lambda: timed(["bash", TASK_SH, "srun", "true"], slurm),
                          lambda: timed(["true"])),
            "log wrapper": (lambda: timed(["bash", LOG_WRAPPER, "SLURM_PROCID", "true"], logged),
                            lambda: timed(["true"])),
            "boot file": (lambda: timed([sys.executable, "-c", "pass"], booted),
                          lambda: timed([sys.executable, "-c", "pass"], base)),
            "end marker": (lambda: timed(["bash", str(marked)], {**base, "JOBID": "1"}),
                           lambda: timed(["bash", str(plain)], base)),
        }
        port = 29700
        cure_on = {**booted, "TORCHHPC_EXIT_CURE": "1"}
        cure_off = {**base, "TORCHHPC_EXIT_CURE": "0"}

        def gloo(env: dict[str, str]) -> Callable[[], float]:
            def run() -> float:
                nonlocal port
                port += 1
                return settle_tail(env, port)
            return run

        heavy = {"exit settle": (gloo(cure_on), gloo(cure_off))}
        if args.cluster:
            from torchhpc.devcluster import load_state

            state = load_state()
            if state is None:
                sys.exit("no dev cluster up: run `torchhpc devcluster up` (TORCHHPC_DEVCLUSTER_DIR picks one)")
            env = {**base, **state.client_env()}
            script = work / "t.sbatch"
            script.write_text("#!/bin/bash\ntrue\n")

            def held() -> float:
                t = time.perf_counter()
                job = subprocess.run(["sbatch", "--parsable", "--hold", "-o", "/dev/null", str(script)], env=env,
                                     capture_output=True, text=True, check=True).stdout.strip().split(";")[0]
                os.mkdir(work / f"job-{job}")  # what torchhpc does while it is held
                subprocess.run(["scontrol", "release", job], env=env, check=True, capture_output=True)
                return time.perf_counter() - t

            heavy["held submit"] = (held, lambda: timed(["sbatch", "-o", "/dev/null", str(script)], env))
        results: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in [*pairs, *heavy]}
        for i in range(args.rounds):
            for name, (with_, without) in {**pairs, **(heavy if i < max(5, args.rounds // 3) else {})}.items():
                first, second = (with_, without) if i % 2 == 0 else (without, with_)
                a, b = first(), second()
                on, off = (a, b) if i % 2 == 0 else (b, a)
                results[name][0].append(on)
                results[name][1].append(off)
    print("| part | with s | without s | cost s | runs |\n|---|---|---|---|---|")
    for name, (with_s, without_s) in results.items():
        cost = statistics.median(with_s) - statistics.median(without_s)
        flag = "" if cost <= GOAL else "  (over the goal)"
        print(f"| {name} | {statistics.median(with_s):.4f} | {statistics.median(without_s):.4f} | {cost:+.4f}{flag} "
              f"| {len(with_s)} |")
    print(f"\nmedians of interleaved rounds (wall, a loaded 2-core machine); goal: each cost <= {GOAL} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
