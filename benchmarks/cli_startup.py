"""How long the torchhpc CLI takes to start, as a fraction of ``import torch``.

The CLI runs on login nodes and at the start of every job, so its parse and
render paths must not pay for torch. Goal: every torchhpc command below takes
at most 0.10 x ``python -c 'import torch'``.

Variants run interleaved (one of each per round, order rotated each round)
so a noisy neighbour slows all of them alike; the table shows medians, the
min-max spread, and ratios of medians to ``import torch`` and to an empty
interpreter. Absolute times on shared machines move 2x between runs; the
ratios are the result.

    python benchmarks/cli_startup.py [--rounds 15] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GOAL = 0.10
# The submit path (issue 69): what `torchhpc run -s slurm ...` does before sbatch, rendered, not submitted.
SUBMIT = "torchhpc run --dry-run -s slurm -N 2 --nproc-per-node 2 --launcher srun examples/pi.py"
SUBMIT_GOAL_S = 0.10


def torchhpc_argv() -> list[str]:
    """The installed ``torchhpc`` script if it sits beside this interpreter, else ``-m``."""
    script = Path(sys.executable).with_name("torchhpc")
    return [str(script)] if script.exists() else [sys.executable, "-m", "torchhpc"]


def variants() -> dict[str, list[str]]:
    th = torchhpc_argv()
    return {
        "torchhpc --help": [*th, "--help"],
        "torchhpc env": [*th, "env"],
        "torchhpc run --dry-run -n 4 examples/pi.py": [*th, "run", "--dry-run", "-n", "4", "examples/pi.py"],
        SUBMIT: [*th, "run", "--dry-run", "-s", "slurm", "-N", "2", "--nproc-per-node", "2", "--launcher", "srun",
                 "examples/pi.py"],
        "python -c 'import torch'": [sys.executable, "-c", "import torch"],
        "python -c pass": [sys.executable, "-c", "pass"],
    }


def time_once(argv: list[str]) -> float:
    start = time.perf_counter()
    cp = subprocess.run(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    elapsed = time.perf_counter() - start
    if cp.returncode != 0:
        raise SystemExit(f"`{' '.join(argv)}` failed ({cp.returncode}): {cp.stderr.decode()[-500:]}")
    return elapsed


def measure(cmds: dict[str, list[str]], rounds: int, warmup: int = 1) -> dict[str, list[float]]:
    names = list(cmds)
    for _ in range(warmup):  # fill the page cache; not recorded
        for name in names:
            time_once(cmds[name])
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            times[name].append(time_once(cmds[name]))
    return times


def report(times: dict[str, list[float]], rounds: int) -> list[dict[str, object]]:
    torch_med = statistics.median(times["python -c 'import torch'"])
    pass_med = statistics.median(times["python -c pass"])
    rows = []
    for name, ts in times.items():
        med = statistics.median(ts)
        rows.append(
            {
                "command": name,
                "median_s": med,
                "min_s": min(ts),
                "max_s": max(ts),
                "vs_import_torch": med / torch_med,
                "vs_python_pass": med / pass_med,
            }
        )
    width = max(len(str(r["command"])) for r in rows)
    print(f"# cli_startup: {rounds} interleaved rounds, medians; goal: torchhpc commands <= {GOAL:.2f} x import torch")
    print(f"# {'command':<{width}}  {'median s':>9}  {'min-max s':>13}  {'/ import torch':>14}  {'/ python pass':>13}")
    for r in rows:
        flag = ""
        if str(r["command"]).startswith("torchhpc"):
            flag = "  ok" if float(r["vs_import_torch"]) <= GOAL else "  OVER GOAL"  # type: ignore[arg-type]
        print(
            f"  {r['command']!s:<{width}}  {r['median_s']:>9.3f}  "
            f"{r['min_s']:>6.3f}-{r['max_s']:<6.3f}  {r['vs_import_torch']:>14.3f}  {r['vs_python_pass']:>13.2f}{flag}"
        )
    sub = statistics.median(times[SUBMIT])
    print(f"# submit path: median {sub:.3f} s, best {min(times[SUBMIT]):.3f} s (goal <= {SUBMIT_GOAL_S:.2f} s, "
          "issue 69; the same render a submit does, before its sbatch)")
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--json", help="also write the rows here")
    args = p.parse_args()
    times = measure(variants(), args.rounds)
    rows = report(times, args.rounds)
    if args.json:
        Path(args.json).write_text(json.dumps({"rounds": args.rounds, "rows": rows, "raw": times}, indent=1))
    over = [r for r in rows if str(r["command"]).startswith("torchhpc") and float(r["vs_import_torch"]) > GOAL]  # type: ignore[arg-type]
    return 1 if over else 0


if __name__ == "__main__":
    raise SystemExit(main())
