"""Submit to end: torchhpc's rendered job against a hand-written sbatch script (and submitit), honestly.

The same program (examples/pi.py, 2 nodes x 2 ranks, one task per rank) on the dev cluster:

  torchhpc  ``torchhpc run -s slurm -N 2 --nproc-per-node 2 --launcher srun examples/pi.py``: the CLI,
            its held submission and release, the rendered script, as a user runs it
  sbatch    ``sbatch seed.sbatch``: a script as the seeds write it (MASTER_ADDR from the node list,
            MASTER_PORT from the job id, one ``srun python examples/pi.py``)
  submitit  a Python script that submits ``CommandFunction([python, pi.py, ...])`` with submitit's
            SlurmExecutor (nodes=2, tasks_per_node=2): each task runs pi.py; where submitit installs

Before every submit the benchmark waits until the cluster is idle (no job in the queue, every node
idle): a job submitted while the previous one's nodes are still completing waits for them, which
is the cluster's state, not the variant's cost; then until the machine's CPUs are quiet (the previous
job's processes still exiting are not the next variant's cost either). The order is shuffled within each round. Every
variant is followed the same way (``scontrol show job -o`` every ``--poll`` s), giving per job:
submit -> end, the submit command, the queue wait (until the first poll that sees it started) and
the running time (from there to the first poll that sees it ended), each as a median with its
spread. Goal: torchhpc / sbatch <= 1.02 as a ratio of medians, running time within 0.1 s.

The ratio of medians compares two medians taken over different rounds; on a shared machine the
running time of one job moves 2x between rounds, which swamps a 2 % difference. So each round's
jobs are also paired: per round, torchhpc - sbatch (and submitit - sbatch) in seconds, for submit ->
end and for the running time, reported as the median of the differences with their spread (min-max
and the middle half). A round's load moves both jobs of a pair alike; the paired median is the
figure to trust, the ratio of medians the one to compare with earlier runs.

The documented run, twice (the two must agree before either is quoted):

    python benchmarks/submit_to_end.py --rounds 15 [--steps 2000000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GOAL, RUN_GOAL = 1.02, 0.1
REPO = Path(__file__).resolve().parent.parent
NOT_ENDED = ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "SUSPENDED")

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

SUBMITIT = """\
import sys, submitit
ex = submitit.SlurmExecutor(folder={folder!r})
ex.update_parameters(nodes=2, ntasks_per_node=2, cpus_per_task=1, job_name="submitit-pi")
job = ex.submit(submitit.helpers.CommandFunction([{python!r}, {program!r}, "--steps", "{steps}"]))
print(job.job_id)
"""


def cluster_env() -> dict[str, str]:
    from torchhpc.devcluster import load_state

    state = load_state()
    if state is None:
        sys.exit("no dev cluster up: run `torchhpc devcluster up` (TORCHHPC_DEVCLUSTER_DIR picks one)")
    env = {**os.environ, **state.client_env()}
    env.setdefault("PYTHONPATH", str(REPO / "src"))
    return env


def wait_idle(env: dict[str, str], timeout: float = 300.0) -> float:
    """Until no job is queued and every node is idle; the seconds it took."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        queue = subprocess.run(["squeue", "-h"], env=env, capture_output=True, text=True, timeout=60).stdout.strip()
        states = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], env=env, capture_output=True, text=True,
                                timeout=60).stdout.split()
        if not queue and states and all(s.rstrip("*~#") == "idle" for s in states):
            quiet_cpus()
            return time.monotonic() - t0
        time.sleep(0.2)
    raise RuntimeError(f"the cluster did not become idle in {timeout:.0f} s")


def _cpu_times() -> tuple[int, int]:
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return fields[3] + fields[4], sum(fields)  # idle + iowait, all


def quiet_cpus(busy: float = 0.25, window: float = 0.2, timeout: float = 10.0) -> None:
    """Until the machine's CPUs are at most ``busy`` over ``window`` s (at most ``timeout`` s): the previous job's
    processes end (its ranks' exit, the standbys', slurmstepd's, the accounting's writes) after the cluster already
    calls the nodes idle, and a submit measured beside them measured them (0.08-0.17 s for the same command in one
    run). Every variant waits the same way."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        idle0, all0 = _cpu_times()
        time.sleep(window)
        idle1, all1 = _cpu_times()
        if all1 > all0 and 1 - (idle1 - idle0) / (all1 - all0) <= busy:
            return


def follow(env: dict[str, str], job: str, submitted: float, poll: float, timeout: float) -> dict[str, float | str]:
    """Poll until the job ended: its state, and when it was first seen started and ended."""
    started = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = subprocess.run(["scontrol", "show", "job", "-o", job], env=env, capture_output=True, text=True, timeout=60)
        m = re.search(r"JobState=(\S+)", r.stdout)
        now = time.monotonic()
        if m and m.group(1) != "PENDING" and started is None:
            started = now
        if m and m.group(1) not in NOT_ENDED:
            started = now if started is None else started
            return {"state": m.group(1), "queue": started - submitted, "running": now - started, "ended": now}
        time.sleep(poll)
    subprocess.run(["scancel", job], env=env, timeout=60, check=False)
    return {"state": "TIMEOUT", "queue": 0.0, "running": 0.0, "ended": time.monotonic()}


def cli() -> list[str]:
    """The ``torchhpc`` command as a user runs it: the installed script beside this Python (``python -m
    torchhpc`` costs runpy's 4 ms more), else the module."""
    script = shutil.which("torchhpc", path=os.path.dirname(sys.executable))
    return [script] if script else [sys.executable, "-m", "torchhpc"]


def submit(name: str, env: dict[str, str], work: Path, steps: int) -> tuple[list[str], Path]:
    """The submit command of a variant, and where its job runs."""
    out = work / f"{name}-{time.monotonic_ns()}"
    out.mkdir()
    program = str(REPO / "examples" / "pi.py")
    if name == "torchhpc":
        return [*cli(), "run", "-s", "slurm", "-N", "2", "--nproc-per-node", "2",
                "--launcher", "srun", "--output-dir", str(out), "--name", "th-pi", "--python", sys.executable,
                program, "--steps", str(steps)], out  # fmt: skip
    if name == "sbatch":
        script = out / "seed.sbatch"
        script.write_text(SEED.format(out=out, python=sys.executable, program=program, steps=steps))
        return ["sbatch", "--parsable", str(script)], out
    code = SUBMITIT.format(folder=str(out / "%j"), python=sys.executable, program=program, steps=steps)
    return [sys.executable, "-c", code], out


def job_id(name: str, stdout: str) -> str:
    if name == "torchhpc":
        m = re.search(r"Submitted slurm:(\d+)", stdout)
        return m.group(1) if m else ""
    last = stdout.strip().splitlines()[-1] if stdout.strip() else ""
    return last.split(";")[0].strip()


def one(name: str, env: dict[str, str], work: Path, steps: int, poll: float, timeout: float) -> dict[str, float]:
    argv, out = submit(name, env, work, steps)
    wait_idle(env)
    t0 = time.monotonic()
    r = subprocess.run(argv, env=env, cwd=out, capture_output=True, text=True, timeout=300)
    t1 = time.monotonic()
    job = job_id(name, r.stdout)
    if r.returncode != 0 or not job.isdigit():
        raise RuntimeError(f"{name}: submit failed ({r.returncode})\n{r.stdout}\n{r.stderr}")
    seen = follow(env, job, t1, poll, timeout)
    if seen["state"] != "COMPLETED":
        raise RuntimeError(f"{name} job {job}: {seen['state']} (output in {out})")
    return {"total": float(seen["ended"]) - t0, "submit": t1 - t0, "queue": float(seen["queue"]),
            "running": float(seen["running"])}


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"


PAIRED = ("total", "running")  # the measures paired per round: submit -> end, and the running time


def quartiles(values: list[float]) -> tuple[float, float]:
    """The middle half's bounds (one value: itself twice)."""
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


def paired(res: dict[str, list[dict[str, float]]], base: str = "sbatch") -> dict[str, dict[str, dict[str, object]]]:
    """Per variant other than ``base``: for each measure in :data:`PAIRED`, the round-by-round differences
    ``variant - base`` in seconds (round i of one against round i of the other, both run under that
    round's load), their median, min, max and middle half (q1, q3)."""
    out: dict[str, dict[str, dict[str, object]]] = {}
    for name, rows in res.items():
        if name == base:
            continue
        n = min(len(rows), len(res[base]))
        out[name] = {}
        for key in PAIRED:
            diffs = [rows[i][key] - res[base][i][key] for i in range(n)]
            if not diffs:
                continue
            q1, q3 = quartiles(diffs)
            out[name][key] = {"diffs": diffs, "median": statistics.median(diffs), "min": min(diffs),
                              "max": max(diffs), "q1": q1, "q3": q3}
    return out


def paired_cell(d: dict[str, object]) -> str:
    """``+0.12 s [-0.30..+0.50], middle half [-0.05..+0.20]``."""
    return (f"{d['median']:+.2f} s [{d['min']:+.2f}..{d['max']:+.2f}], "
            f"middle half [{d['q1']:+.2f}..{d['q3']:+.2f}]")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=15,
                   help="rounds, each one job per variant (default 15, the documented run: run it twice)")
    p.add_argument("--steps", type=int, default=2_000_000, help="pi.py --steps (small: the job is mostly start and exit)")
    p.add_argument("--poll", type=float, default=0.1, help="seconds between scontrol polls (the same for every variant)")
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--seed", type=int, default=0, help="the shuffle's seed")
    p.add_argument("--no-submitit", action="store_true")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    env = cluster_env()
    variants = ["torchhpc", "sbatch"]
    try:
        import submitit  # noqa: F401

        if not args.no_submitit:
            variants.append("submitit")
    except ImportError:
        print("submitit is not installed here (pip install submitit): its row is left out", file=sys.stderr)
    rng = random.Random(args.seed)
    res: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory(prefix="submit-to-end-", dir=os.environ.get("TMPDIR", "/var/tmp")) as d:
        work = Path(d)
        # An installed package has its bytecode compiled: cache it aside, warmed once, for every variant.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(work / "pycache")
        for warm in ("import torchhpc.cli.main, torchhpc.dist, torch", "import submitit"):
            try:
                subprocess.run([sys.executable, "-c", warm], env=env, timeout=1800, check=False)
            except subprocess.TimeoutExpired:
                print(f"warm-up {warm!r} did not finish in 30 min: the machine is overloaded", file=sys.stderr)
        for i in range(args.rounds):
            order = variants[:]
            rng.shuffle(order)
            for name in order:
                res[name].append(one(name, env, work, args.steps, args.poll, args.timeout))
            print(f"round {i + 1}: " + "  ".join(
                f"{n} " + "/".join(f"{res[n][-1][k]:.2f}" for k in ("total", "submit", "queue", "running")) for n in order
            ) + "  (total/submit/queue/running s)", flush=True)
    med = {n: {k: statistics.median(r[k] for r in rows) for k in rows[0]} for n, rows in res.items()}
    print("\nmedian [min-max] seconds, idle cluster before every submit, order shuffled in each round\n")
    print("| variant | submit -> end | submit command | queue wait | running | ratio to sbatch |\n|---|---|---|---|---|---|")
    for n, rows in res.items():
        cells = " | ".join(spread([r[k] for r in rows]) for k in ("total", "submit", "queue", "running"))
        print(f"| {n} | {cells} | {med[n]['total'] / med['sbatch']['total']:.3f} |")
    ratio = med["torchhpc"]["total"] / med["sbatch"]["total"]
    run_diff = med["torchhpc"]["running"] - med["sbatch"]["running"]
    pairs = paired(res)
    print(f"\ntorchhpc / sbatch: {ratio:.3f} (goal <= {GOAL}); running time {run_diff:+.2f} s (goal: at most +{RUN_GOAL})")
    print(f"\npaired by round ({args.rounds} rounds): variant - sbatch, median [min..max], middle half\n")
    print("| variant | ratio of medians | submit -> end, paired | running, paired |\n|---|---|---|---|")
    for n, by in pairs.items():
        print(f"| {n} | {med[n]['total'] / med['sbatch']['total']:.3f} | "
              + " | ".join(paired_cell(by[k]) if k in by else "-" for k in PAIRED) + " |")
    if args.json:
        args.json.write_text(json.dumps({"results": res, "medians": med, "ratio": ratio, "rounds": args.rounds,
                                         "paired": pairs,
                                         "ratios": {n: med[n]["total"] / med["sbatch"]["total"] for n in med}},
                                        indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
