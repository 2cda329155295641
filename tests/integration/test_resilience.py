"""A job that survives a node loss on its own: spares, restart by policy, requeue without the node.

Every scenario runs on the real dev cluster, submitted without ``--wait`` (no client watches):
``scripts/ckpt_train.py`` (deterministic DDP, gloo, 2 nodes x 2 ranks) under the in-allocation
supervisor, hit by a real fault: ``torchhpc devcluster fail NODE`` (link cut, then every process
of the node killed, slurmd and slurmstepd included), a rank that sleeps forever, an exception.
The final parameters are compared bit for bit with an uninterrupted run. ``pytest -s`` prints a
``RESILIENCE`` line per scenario with its figures.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tests.integration.conftest import SlurmClient
from tests.integration.test_nothing_lost import assert_bit_identical, events, log_of, submit, wait_until

pytestmark = pytest.mark.cluster("slurm")

STEPS = 200
EVERY = 20
TRAIN = ["--steps", str(STEPS), "--ckpt-every", str(EVERY), "--fixed-buckets"]
FAULT_AFTER = 100


def devcluster(cluster: Any, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "torchhpc", "devcluster", *args, "--state-dir", cluster.state_dir],
                          capture_output=True, text=True, timeout=120, env=cluster.client_env())
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def attempts(out: Path, name: str, job: str) -> list[dict[str, Any]]:
    path = out / f"{name}-{job}" / "attempts.json"
    return json.loads(path.read_text()) if path.exists() else []


def rank0_step(out: Path, name: str, job: str) -> int:
    text = log_of(out, name, job)
    steps = [int(m.group(1)) for m in re.finditer(r"^step (\d+) ", text, re.M)]
    return max(steps, default=0)


def repeated_steps(text: str) -> int:
    """Optimizer steps done twice: how far each attempt got beyond the step the next one started at."""
    reached, repeated = 0, 0
    for kind, step, _r, _t in events(text):
        if kind == "START":
            repeated += max(0, reached - step)
            reached = step
        else:
            reached = max(reached, step)
    return repeated


def report(scenario: str, **figures: Any) -> None:
    text = " ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in figures.items())
    print(f"\nRESILIENCE {scenario}: {text}", flush=True)


@pytest.fixture(scope="module")
def reference(slurm_cluster: Any, slurm: SlurmClient, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Final parameters of an uninterrupted 2 x 2 run of the same training."""
    out = tmp_path_factory.mktemp("ref")
    job = submit(slurm_cluster, out, "ref", ["-N", "2", "--nproc-per-node", "2", "--launcher", "srun"], TRAIN)
    assert slurm.wait(job, timeout=300)["JobState"] == "COMPLETED", log_of(out, "ref", job)
    return out / "final.pt"


@pytest.mark.parametrize("launcher", ["srun", "torchrun", "mpirun"])
def test_node_loss_with_a_spare_completes_on_its_own(
    launcher: str, slurm_cluster: Any, slurm: SlurmClient, reference: Path, tmp_path: Path
) -> None:
    """One of the two working nodes (not the batch host) fails after step 100; the supervisor
    excludes it, goes on on the spare, and the job ends COMPLETED with the uninterrupted run's
    parameters, at most one checkpoint interval done twice."""
    name = f"spare{launcher[:2]}"
    job = submit(slurm_cluster, tmp_path, name,
                 ["-N", "2", "--spares", "1", "--nproc-per-node", "2", "--max-restarts", "1"],
                 [*TRAIN, "--sleep", "0.1"], launcher=launcher)
    hosts = slurm.run(["scontrol", "show", "hostnames", wait_until(
        lambda: slurm.job(job).get("NodeList") if slurm.job(job).get("JobState") == "RUNNING" else None,
        120, "the job to start")]).stdout.split()
    victim = hosts[1]  # hosts[0] is the batch host
    wait_until(lambda: rank0_step(tmp_path, name, job) > FAULT_AFTER, 240, f"step {FAULT_AFTER}", every=0.1)
    t_fault = time.time()
    try:
        said = devcluster(slurm_cluster, "fail", victim)
        assert "link cut" in said and "killed" in said, said
        info = slurm.wait(job, timeout=300)
    finally:
        devcluster(slurm_cluster, "revive", victim)
    text = log_of(tmp_path, name, job)
    assert info["JobState"] == "COMPLETED", text[-3000:]
    tries = attempts(tmp_path, name, job)
    assert [a["class"] for a in tries] == ["node-failure", None], tries
    assert victim in tries[0]["excluded"] and victim not in tries[1]["nodes"], tries
    assert hosts[2] in tries[1]["nodes"], tries  # the spare
    assert_bit_identical(tmp_path / "final.pt", reference)
    again = repeated_steps(text)
    assert again <= EVERY, f"{again} steps done twice"
    starts = [t for kind, _s, r, t in events(text) if kind == "step" and r == 1]
    report(f"spare-{launcher}", fault_to_second_attempt_first_step_s=min(starts) - t_fault, steps_done_twice=again)
