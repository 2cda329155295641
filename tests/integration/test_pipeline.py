"""``torchhpc pipeline`` for real: prep -> train on 2 x 2 -> eval on the dev cluster, its table while it
runs and at the end, cancelling the first step; and a local pipeline whose first step fails."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import PYTHON, REPO

pytestmark = pytest.mark.usefixtures("clean_user_env")

CHAIN = f"""
name = "chain"
[defaults]
scheduler = "{{scheduler}}"
output_dir = "{{out}}"

[steps.prep]
program = ["{PYTHON}", "-c", "import time; time.sleep({{sleep}}); open('data.txt', 'w').write('7')"]

[steps.train]
program = ["{REPO}/examples/pi.py", "--steps", "200000"]
python = "{PYTHON}"
nodes = 2
nproc_per_node = 2
launcher = "srun"
after = ["prep"]

[steps.eval]
program = ["{PYTHON}", "-c", "print('eval read', open('data.txt').read())"]
after = ["train"]
"""


def torchhpc(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "torchhpc", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def table(path: Path, env: dict[str, str]) -> dict[str, dict[str, Any]]:
    done = torchhpc("pipeline", "status", str(path), "--json", env=env, cwd=path.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    return {row["step"]: row for row in json.loads(done.stdout)["steps"]}


def write(tmp_path: Path, text: str, **values: object) -> Path:
    path = tmp_path / "chain.toml"
    path.write_text(text.format(out=tmp_path / "runs", **values))
    return path


@pytest.mark.cluster("slurm")
def test_prep_train_eval_on_the_dev_cluster(slurm_cluster: Any, tmp_path: Path) -> None:
    env = slurm_cluster.client_env()
    path = write(tmp_path, CHAIN, scheduler="slurm", sleep=3)
    done = torchhpc("pipeline", str(path), env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.split()[:4] == ["STEP", "JOB", "STATE", "AFTER"], done.stdout
    rows = table(path, env)
    assert rows["train"]["state"] == "PENDING" and rows["train"]["after"] == "prep", rows
    assert rows["eval"]["state"] == "PENDING" and rows["eval"]["detail"] == "waits for train", rows
    deadline = time.monotonic() + 180
    while rows["train"]["state"] == "PENDING" and time.monotonic() < deadline:
        time.sleep(0.5)
        rows = table(path, env)
    if rows["train"]["state"] == "RUNNING":  # while it runs: prep done, eval waits for it
        assert rows["prep"]["state"] == "COMPLETED", rows
        assert rows["eval"]["state"] == "PENDING" and rows["eval"]["detail"] == "waits for train", rows
    done = torchhpc("pipeline", "status", str(path), "--wait", "--json", env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {row["step"]: row for row in json.loads(done.stdout)["steps"]}
    assert [rows[s]["state"] for s in ("prep", "train", "eval")] == ["COMPLETED"] * 3, rows
    logs = torchhpc("pipeline", "logs", str(path), "eval", env=env, cwd=tmp_path)
    assert "eval read 7" in logs.stdout, logs.stdout + logs.stderr
    train = torchhpc("pipeline", "logs", str(path), "train", "--rank", "3", env=env, cwd=tmp_path)
    assert "rank 3/4 on" in train.stdout, train.stdout + train.stderr


@pytest.mark.cluster("slurm")
def test_cancelling_the_first_step_cancels_the_rest(slurm_cluster: Any, slurm: Any, tmp_path: Path) -> None:
    """Each step is cancelled by torchhpc itself: a ``scancel`` shim first on PATH logs every call. (The
    states alone cannot show it: Slurm's kill-on-invalid-dep would end train and eval after prep.)"""
    env = slurm_cluster.client_env()
    real = shutil.which("scancel", path=env["PATH"])
    assert real, env["PATH"]
    shim, calls = tmp_path / "bin" / "scancel", tmp_path / "scancel.calls"
    shim.parent.mkdir()
    shim.write_text(f'#!/bin/sh\necho "$*" >> {calls}\nexec {real} "$@"\n')
    shim.chmod(0o755)
    env = {**env, "PATH": f"{shim.parent}{os.pathsep}{env['PATH']}"}
    path = write(tmp_path, CHAIN, scheduler="slurm", sleep=120)
    ids: list[str] = []
    try:
        assert torchhpc("pipeline", str(path), env=env, cwd=tmp_path).returncode == 0
        rows = table(path, env)
        ids = [rows[s]["handle"].split(":")[1] for s in ("prep", "train", "eval")]
        done = torchhpc("pipeline", "cancel", str(path), "prep", env=env, cwd=tmp_path)
        assert done.stdout.split("\n")[:3] == ["prep: cancelled", "train: cancelled", "eval: cancelled"], done.stdout
        cancelled = [line.split()[-1] for line in calls.read_text().splitlines()]
        assert sorted(cancelled) == sorted(ids), (cancelled, ids)  # one scancel per step, each its own job
        for job in ids:
            assert slurm.wait(job, timeout=60)["JobState"] == "CANCELLED", rows
        assert [table(path, env)[s]["state"] for s in ("prep", "train", "eval")] == ["CANCELLED"] * 3
    finally:
        if ids:
            slurm.run(["scancel", *ids], check=False)


LOCAL = f"""
[steps.prep]
program = ["{PYTHON}", "-c", "raise SystemExit(2)"]
[steps.train]
program = ["{PYTHON}", "-c", "print('train')"]
after = ["prep"]
[steps.report]
program = ["{PYTHON}", "-c", "print('report after a failure')"]
after_fail = ["prep"]
"""


def test_local_pipeline_reports_never_after_a_failure(tmp_path: Path) -> None:
    path = tmp_path / "local.toml"
    path.write_text(LOCAL)
    done = torchhpc("pipeline", str(path), "--wait", "--json", env=dict(os.environ), cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr  # not every step completed
    rows = {row["step"]: row for row in json.loads(done.stdout)["steps"]}
    assert rows["prep"]["state"] == "FAILED", rows
    assert rows["train"]["state"] == "NEVER" and rows["train"]["detail"] == "after prep FAILED", rows
    assert rows["report"]["state"] == "COMPLETED", rows
    logs = torchhpc("pipeline", "logs", str(path), "report", env=dict(os.environ), cwd=tmp_path)
    assert "report after a failure" in logs.stdout, logs.stdout + logs.stderr
