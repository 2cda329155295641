"""Issue 18's lifecycle and pre-submit checks, for real: the dev cluster's Slurm and local jobs.

Slurm: sbatch, sinfo, squeue and scontrol of the dev cluster (slurmctld + slurmd
in network namespaces); nothing faked. Local: background jobs started by the
real CLI, followed by the real CLI in other processes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO

PI = str(REPO / "examples" / "pi.py")


def torchhpc(env: dict[str, str], *args: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "torchhpc", *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.cluster("slurm")
def test_slurm_refuses_before_sbatch(slurm_cluster: Any, tmp_path: Path) -> None:
    env = {**slurm_cluster.client_env(), "HOME": str(tmp_path), "TORCHHPC_STATE_DIR": str(tmp_path / "state")}
    # GPUs the partition does not have, from sinfo (the dev cluster has none).
    done = torchhpc(env, "run", "-s", "slurm", "--gpus-per-node", "1", PI, cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "has no GPUs (from sinfo)" in done.stderr and "Submitted" not in done.stdout
    # A missing script: one line before sbatch, and squeue shows nothing new.
    before = subprocess.run(["squeue", "-h", "-o", "%i"], env=env, capture_output=True, text=True).stdout
    done = torchhpc(env, "run", "-s", "slurm", "--nodes", "2", "missing.py", cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.startswith("Error: the program 'missing.py' does not exist")
    after = subprocess.run(["squeue", "-h", "-o", "%i"], env=env, capture_output=True, text=True).stdout
    assert before == after
    # list and status --json against the real cluster.
    done = torchhpc(env, "run", "-s", "slurm", "--json", PI, "--steps", "100", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    handle = json.loads(done.stdout)["handle"]
    done = torchhpc(env, "wait", handle, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    st = json.loads(torchhpc(env, "status", "--json", handle, cwd=tmp_path).stdout)
    assert st["state"] == "COMPLETED" and st["handle"] == handle
    done = torchhpc(env, "list", "-s", "slurm", "--json", cwd=tmp_path)
    assert done.returncode == 0 and isinstance(json.loads(done.stdout), list)
    done = torchhpc(env, "status", "--json", "slurm:999999", cwd=tmp_path)
    assert done.returncode != 0 and "error" in json.loads(done.stdout)
