"""A light touch on the real dev cluster's controller: every scontrol/squeue/sacct call counted by a
PATH shim in front of the real commands (benchmarks/controller_load.py also reads slurmctld's sdiag).

- ``status`` of a 100-task array is one call; ``status`` of several jobs is one call.
- ``run --wait`` learns the end from <job dir>/end.json, written by the real batch script, and asks
  the controller on the backed-off schedule (schedulers/waiting.py), not every second.
- ``scancel`` while the step runs: the batch shell's trap writes CANCELLED and ``wait`` returns.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.cli_run import torchhpc
from tests.conftest import PYTHON

pytestmark = pytest.mark.cluster("slurm")

COUNTED = ("scontrol", "squeue", "sacct")


def shim_env(cluster: Any, tmp_path: Path, lie: bool = False) -> tuple[dict[str, str], Path]:
    """The cluster's client env with a PATH shim that logs each counted command, then runs the real one.
    ``lie``: the controller's answers say RUNNING where they said COMPLETED."""
    env = cluster.client_env()
    shim, log = tmp_path / "shim", tmp_path / "calls.log"
    shim.mkdir()
    for name in COUNTED:
        real = subprocess.run(["bash", "-c", f"command -v {name}"], env=env, capture_output=True, text=True).stdout.strip()
        assert real, f"{name} not on the cluster's PATH"
        run = f'set -o pipefail; {real} "$@" | sed s/COMPLETED/RUNNING/g' if lie else f'exec {real} "$@"'
        (shim / name).write_text(f'#!/bin/bash\necho "{name} $*" >> {log}\n{run}\n')
        (shim / name).chmod(0o755)
    env["PATH"] = f"{shim}:{env['PATH']}"
    return env, log


def calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def test_status_of_a_100_task_array_is_one_call(slurm: Any, slurm_cluster: Any, tmp_path: Path) -> None:
    """Held, so that 100 tasks do not load the shared machine: the controller lists them all the same."""
    env, log = shim_env(slurm_cluster, tmp_path)
    array = slurm.sbatch(["--hold", "--array=0-99", "-o", "/dev/null", "--wrap", "true"])
    other = slurm.sbatch(["--hold", "-o", "/dev/null", "--wrap", "true"])
    try:
        one = torchhpc(env, "status", "--json", f"slurm:{array}", cwd=tmp_path)
        assert one.returncode == 0, one.stderr
        assert len(json.loads(one.stdout)["tasks"]) == 100
        assert len(calls(log)) == 1, calls(log)
        log.unlink()
        many = torchhpc(env, "status", "--json", f"slurm:{array}", f"slurm:{other}", f"slurm:{array}_7", cwd=tmp_path)
        assert many.returncode == 0, many.stderr
        shown = json.loads(many.stdout)
        assert [s["handle"] for s in shown] == [f"slurm:{array}", f"slurm:{other}", f"slurm:{array}_7"]
        assert len(shown[0]["tasks"]) == 100 and shown[1]["state"] == "PENDING"
        assert [c.split()[0] for c in calls(log)] == ["squeue"], calls(log)
    finally:
        slurm.run(["scancel", array, other], check=False)


def test_wait_learns_the_end_from_the_marker(slurm: Any, slurm_cluster: Any, tmp_path: Path) -> None:
    """The controller (through the shim) never says COMPLETED: only a wait that reads end.json ends, and
    with the marker's state (one that ignored it would run into --timeout)."""
    env, log = shim_env(slurm_cluster, tmp_path, lie=True)
    prog = tmp_path / "sleepy.py"
    prog.write_text("import time; time.sleep(6); print('done', flush=True)\n")
    sub = torchhpc(env, "run", "--scheduler", "slurm", "-N", "1", "--launcher", "srun", "--python", PYTHON,
                   "--output-dir", str(tmp_path), str(prog), cwd=tmp_path)
    assert sub.returncode == 0, sub.stderr
    job = re.search(r"Submitted slurm:(\d+)", sub.stdout).group(1)  # type: ignore[union-attr]
    try:
        start = time.monotonic()
        waited = torchhpc(env, "wait", f"slurm:{job}", "--timeout", "90", cwd=tmp_path)
        elapsed = time.monotonic() - start
        assert waited.returncode == 0 and "COMPLETED" in waited.stdout + waited.stderr, waited.stdout + waited.stderr
        end = json.loads((tmp_path / f"sleepy-{job}" / "end.json").read_text())
        assert end["state"] == "COMPLETED" and end["exit_code"] == 0
        asked = [c for c in calls(log) if c.startswith("scontrol show job")]
        # questions at 0, 1, 3, 7, 15 s... (one more each doubling), plus a few to confirm the marker;
        # polling every second would have asked about `elapsed` times
        schedule = len([t for t in (0, 1, 3, 7, 15, 31, 61) if t <= elapsed])
        assert 1 <= len(asked) <= schedule + 4, (asked, elapsed)
    finally:
        slurm.run(["scancel", job], check=False)


def test_a_cancelled_job_writes_cancelled(slurm_cluster: Any, slurm: Any, tmp_path: Path) -> None:
    env = slurm_cluster.client_env()
    prog = tmp_path / "long.py"
    prog.write_text("import time; print('up', flush=True); time.sleep(120)\n")
    sub = torchhpc(env, "run", "--scheduler", "slurm", "-N", "1", "--launcher", "srun", "--python", PYTHON,
                   "--output-dir", str(tmp_path), str(prog), cwd=tmp_path)
    assert sub.returncode == 0, sub.stderr
    job = re.search(r"Submitted slurm:(\d+)", sub.stdout).group(1)  # type: ignore[union-attr]
    ranks = tmp_path / f"long-{job}" / "ranks"
    deadline = time.monotonic() + 120
    while not any("up" in p.read_text() for p in ranks.glob("rank-*.log")):
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.3)
    try:
        slurm.run(["scancel", job])
    finally:
        slurm.run(["scancel", job], check=False)  # also when the job never started
    waited = torchhpc(env, "wait", f"slurm:{job}", "--timeout", "120", cwd=tmp_path)
    assert waited.returncode != 0 and "CANCELLED" in waited.stderr, waited.stderr
    end = json.loads((tmp_path / f"long-{job}" / "end.json").read_text())
    assert end["state"] == "CANCELLED" and end["exit_code"] != 0
    assert os.path.exists(tmp_path / f"long-{job}" / "slurm.out")
