"""Submit to end: torchhpc's rendered job against a hand-written seed-style sbatch script.

The same program (examples/pi.py, 2 nodes x 2 ranks, srun-direct) on the dev cluster, two ways:

  (a) ``torchhpc run -s slurm -N 2 --nproc-per-node 2 --launcher srun examples/pi.py``: the CLI,
      its held submission and release, the rendered script (rendezvous, port probe, per-rank
      log files, task shim), as a user runs it
  (b) ``sbatch seed.sbatch``: a script as the seeds write it (MASTER_ADDR from the node list,
      MASTER_PORT from the job id, one ``srun python examples/pi.py``)

The clock starts before the submit command and stops at the first poll that sees the job in a
final state; both are polled the same way (``scontrol show job -o`` every ``--poll`` seconds).
Rounds are interleaved, the order alternating, so both see the same load drift. The table gives
each variant's median and spread and the ratio of medians (a)/(b); the goal is <= 1.03: what
torchhpc's machinery adds at start and at exit.

    python benchmarks/submit_to_end.py [--rounds 5] [--steps 2000000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GOAL = 1.03
REPO = Path(__file__).resolve().parent.parent
FINAL_STATES = ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "SUSPENDED")

SEED = """\
#!/bin/bash
#SBATCH --job-name=seed-pi
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --cpus-per-task=1
#SBATCH --output={out}/%x-%j.out
export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export MASTER_PORT=$(( 10000 + SLURM_JOB_ID % 20000 ))
srun {python} {program} --steps {steps}
"""


def cluster_env() -> dict[str, str]:
    from torchhpc.devcluster import load_state

    state = load_state()
    if state is None:
        sys.exit("no dev cluster up: run `torchhpc devcluster up` (TORCHHPC_DEVCLUSTER_DIR picks one)")
    env = {**os.environ, **state.client_env()}
    env.setdefault("PYTHONPATH", str(REPO / "src"))
    return env


# Where the time went, from the job's own record (whole seconds): queued = EligibleTime..StartTime
# (a held job is eligible once released), ran = StartTime..EndTime.
PHASES: dict[str, dict[str, list[float]]] = {}
# The job seen running by the polls: from the first poll that finds it out of PENDING to the final one
# (the queue wait, which other users' jobs on a shared cluster decide, left out).
STARTED: dict[str, float] = {}
RUN: dict[str, list[float]] = {}
# How long the submit command itself took (torchhpc: the CLI, sbatch --hold, the job directory, the release).
SUBMIT: dict[str, list[float]] = {}


def _phases(name: str, record: str) -> None:
    from datetime import datetime

    stamps = dict(re.findall(r"(SubmitTime|EligibleTime|StartTime|EndTime)=(\S+)", record))
    try:
        t = {k: datetime.fromisoformat(v).timestamp() for k, v in stamps.items()}
    except ValueError:
        return
    got = PHASES.setdefault(name, {"submit-eligible": [], "eligible-start": [], "start-end": []})
    got["submit-eligible"].append(t["EligibleTime"] - t["SubmitTime"])
    got["eligible-start"].append(t["StartTime"] - t["EligibleTime"])
    got["start-end"].append(t["EndTime"] - t["StartTime"])


def wait(env: dict[str, str], job: str, poll: float, timeout: float, name: str = "") -> str:
    """Poll ``scontrol show job -o`` until a final state; the same poll for both variants."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = subprocess.run(["scontrol", "show", "job", "-o", job], env=env, capture_output=True, text=True, timeout=60)
        m = re.search(r"JobState=(\S+)", r.stdout)
        if m and m.group(1) != "PENDING" and name not in STARTED:
            STARTED[name] = time.monotonic()
        if m and m.group(1) not in FINAL_STATES:
            if name:
                _phases(name, r.stdout)
                RUN.setdefault(name, []).append(time.monotonic() - STARTED.pop(name, time.monotonic()))
            return m.group(1)
        time.sleep(poll)
    subprocess.run(["scancel", job], env=env, timeout=60, check=False)
    return "TIMEOUT"


def run_torchhpc(env: dict[str, str], work: Path, steps: int, poll: float, timeout: float) -> float:
    out = work / f"th-{time.monotonic_ns()}"
    argv = [
        sys.executable, "-m", "torchhpc", "run", "-s", "slurm", "-N", "2", "--nproc-per-node", "2",
        "--launcher", "srun", "--output-dir", str(out), "--name", "th-pi",
        str(REPO / "examples" / "pi.py"), "--steps", str(steps),
    ]  # fmt: skip
    t0 = time.monotonic()
    r = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    SUBMIT.setdefault("torchhpc", []).append(time.monotonic() - t0)
    m = re.search(r"Submitted slurm:(\d+)", r.stdout)
    if r.returncode != 0 or not m:
        raise RuntimeError(f"torchhpc run failed ({r.returncode})\n{r.stdout}\n{r.stderr}")
    state = wait(env, m.group(1), poll, timeout, "torchhpc")
    took = time.monotonic() - t0
    if state != "COMPLETED":
        raise RuntimeError(f"torchhpc job {m.group(1)}: {state}")
    return took


def run_seed(env: dict[str, str], work: Path, steps: int, poll: float, timeout: float) -> float:
    out = work / f"seed-{time.monotonic_ns()}"
    out.mkdir()
    script = out / "seed.sbatch"
    script.write_text(SEED.format(out=out, python=sys.executable, program=REPO / "examples" / "pi.py", steps=steps))
    t0 = time.monotonic()
    r = subprocess.run(["sbatch", "--parsable", str(script)], env=env, cwd=REPO, capture_output=True, text=True,
                       timeout=300)
    SUBMIT.setdefault("seed", []).append(time.monotonic() - t0)
    job = r.stdout.strip().split(";")[0]
    if r.returncode != 0 or not job.isdigit():
        raise RuntimeError(f"sbatch failed ({r.returncode})\n{r.stdout}\n{r.stderr}")
    state = wait(env, job, poll, timeout, "seed")
    took = time.monotonic() - t0
    if state != "COMPLETED":
        raise RuntimeError(f"seed job {job}: {state}\n" + "".join(p.read_text() for p in out.glob("*.out")))
    return took


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=2_000_000, help="pi.py --steps (small: the job is mostly start and exit)")
    p.add_argument("--poll", type=float, default=0.25, help="seconds between scontrol polls")
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    env = cluster_env()
    times: dict[str, list[float]] = {"torchhpc": [], "seed": []}
    runs = {"torchhpc": run_torchhpc, "seed": run_seed}
    with tempfile.TemporaryDirectory(prefix="submit-to-end-", dir=os.environ.get("TMPDIR", "/var/tmp")) as d:
        work = Path(d)
        # An installed torchhpc has its bytecode compiled; a checkout run with PYTHONDONTWRITEBYTECODE would
        # compile every module at each start (the CLI, and every rank that imports torchhpc.dist). Cache it
        # aside, warmed once, so both variants start as they would from an install.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(work / "pycache")
        subprocess.run([sys.executable, "-m", "torchhpc", "run", "-s", "slurm", "-N", "2", "--nproc-per-node", "2",
                        "--dry-run", str(REPO / "examples" / "pi.py")], env=env, cwd=REPO, capture_output=True,
                       timeout=300)  # fmt: skip
        subprocess.run([sys.executable, "-c", "import torchhpc.dist, torch"], env=env, timeout=300, check=False)
        for i in range(args.rounds):
            order = ["torchhpc", "seed"] if i % 2 == 0 else ["seed", "torchhpc"]
            for name in order:
                times[name].append(runs[name](env, work, args.steps, args.poll, args.timeout))
            print(f"round {i + 1}: " + "  ".join(f"{n} {times[n][-1]:.2f}s" for n in times), flush=True)
    med = {n: statistics.median(v) for n, v in times.items()}
    print("\n| variant | median s | min s | max s | runs |\n|---|---|---|---|---|")
    for n, v in times.items():
        print(f"| {n} | {med[n]:.2f} | {min(v):.2f} | {max(v):.2f} | {len(v)} |")
    print("\n| variant | submit command s | running (polls) s | submit + running s |\n|---|---|---|---|")
    own = {n: [a + b for a, b in zip(SUBMIT[n], RUN[n])] for n in times}
    for n in times:
        print(f"| {n} | {statistics.median(SUBMIT[n]):.2f} | {statistics.median(RUN[n]):.2f} "
              f"[{min(RUN[n]):.2f}-{max(RUN[n]):.2f}] | {statistics.median(own[n]):.2f} |")
    own_ratio = statistics.median(own["torchhpc"]) / statistics.median(own["seed"])
    print(f"ratio of medians without the queue wait: {own_ratio:.3f}")
    print("submit command (median s): " + ", ".join(f"{n} {statistics.median(v):.2f}" for n, v in SUBMIT.items()))
    print("\nphases from the job records (median s): " + "; ".join(
        f"{n}: " + ", ".join(f"{k} {statistics.median(v):.0f}" for k, v in ph.items()) for n, ph in PHASES.items()))
    ratio = med["torchhpc"] / med["seed"]
    per_round = statistics.median(a / b for a, b in zip(times["torchhpc"], times["seed"]))
    print(f"\nratio of medians torchhpc/seed: {ratio:.3f} (median of per-round ratios {per_round:.3f}; goal <= {GOAL})")
    if args.json:
        args.json.write_text(json.dumps({"times": times, "ratio": ratio, "per_round": per_round, "submit": SUBMIT,
                                         "running": RUN, "phases": PHASES}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
