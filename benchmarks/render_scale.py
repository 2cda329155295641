"""Rendering and parsing at 1024 nodes stays fast: a bound per operation, checked here, not in a test.

Each operation runs ``--repeat`` times; the median must stay under its bound
(generous: 2 shared cores, other work beside). The bounds are what a rank or a
submit may spend on bookkeeping before the real work starts.

    python benchmarks/render_scale.py [--repeat 20] [--json out.json]

Exit 1 when any median exceeds its bound.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.fakes: the fake runner

from tests.fakes import FakeRunner

from torchhpc.core.hostlist import compress, expand
from torchhpc.core.spec import Entrypoint, JobSpec
from torchhpc.env import detect, tasks_per_node
from torchhpc.launchers.boot import task_argv
from torchhpc.schedulers.slurm.slurm import SlurmScheduler

NODES = "gpu[0001-1024]"
HETERO = "4(x1000),2(x24)"
LAST_TASK = {  # the last task of a 1024-node, 4048-task step: the worst case for every lookup
    "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_PROCID": "4047", "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1023", "SLURM_NTASKS": "4048", "SLURM_STEP_NUM_TASKS": "4048",
    "SLURM_STEP_NUM_NODES": "1024", "SLURM_NNODES": "1024", "SLURM_STEP_TASKS_PER_NODE": HETERO,
    "SLURM_TASKS_PER_NODE": HETERO, "SLURM_STEP_NODELIST": NODES, "SLURM_JOB_NODELIST": NODES,
}  # fmt: skip


def _render(launcher: str) -> Callable[[], object]:
    sched = SlurmScheduler(runner=FakeRunner())
    job = JobSpec(
        Entrypoint.parse(["train.py"], python="python3"), nodes=1024, nproc_per_node=4,
        scheduler="slurm", launcher=launcher, name="big", output_dir="/scratch/out",
    )  # fmt: skip
    return lambda: sched.render(job)


def _shim() -> object:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **LAST_TASK}
    out = subprocess.run(task_argv(["true"]), env=env, check=True, timeout=30)
    return out.returncode


HOSTS = expand(NODES)
# (name, operation, bound in seconds)
CASES: list[tuple[str, Callable[[], object], float]] = [
    ("expand gpu[0001-1024]", lambda: expand(NODES), 0.05),
    ("compress 1024 hosts", lambda: compress(HOSTS), 0.05),
    ("tasks_per_node 4(x1000),2(x24)", lambda: tasks_per_node(HETERO), 0.01),
    ("detect() last task of 1024 nodes", lambda: detect(LAST_TASK), 0.05),
    ("render sbatch 1024 nodes, torchrun", _render("torchrun"), 0.1),
    ("render sbatch 1024 nodes, srun", _render("srun"), 0.1),
    ("render sbatch 1024 nodes, mpirun", _render("mpirun"), 0.1),
    ("bash task shim, last of 4048 tasks", _shim, 0.5),  # includes starting bash
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    rows = []
    worst = 0.0
    print(f"# {'operation':<38} {'median ms':>10} {'max ms':>8} {'bound ms':>9}")
    for name, op, bound in CASES:
        op()  # warm-up (imports, regex compile)
        times = []
        for _ in range(a.repeat):
            t = time.perf_counter()
            op()
            times.append(time.perf_counter() - t)
        med = statistics.median(times)
        worst = max(worst, med / bound)
        ok = med <= bound
        rows.append({"operation": name, "median_s": med, "max_s": max(times), "bound_s": bound, "ok": ok})
        flag = "" if ok else "  OVER BOUND"
        print(f"  {name:<38} {med * 1e3:10.2f} {max(times) * 1e3:8.2f} {bound * 1e3:9.0f}{flag}")
    print(f"# worst median/bound: {worst:.2f}")
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
