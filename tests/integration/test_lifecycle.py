"""Issue 18's lifecycle and pre-submit checks, for real: the dev cluster's Slurm and local jobs.

Slurm: sbatch, sinfo, squeue and scontrol of the dev cluster (slurmctld + slurmd
in network namespaces); nothing faked. Local: background jobs started by the
real CLI, followed by the real CLI in other processes.
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

from tests.cli_run import torchhpc
from tests.conftest import REPO

PI = str(REPO / "examples" / "pi.py")


@pytest.mark.cluster("slurm")
def test_slurm_refuses_before_sbatch(slurm_cluster: Any, tmp_path: Path) -> None:
    env = {**slurm_cluster.client_env(), "HOME": str(tmp_path), "TORCHHPC_STATE_DIR": str(tmp_path / "state")}
    # GPUs the partition does not have, from sinfo (the dev cluster has none).
    done = torchhpc(env, "run", "-s", "slurm", "--gpus-per-node", "1", PI, cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "has no GPUs (from sinfo)" in done.stderr and "Submitted" not in done.stdout
    # A missing script: one line before sbatch, and squeue shows nothing new.
    # (jobs of this test only: other tests submit side by side, and every job here names tmp_path)
    mine = ["squeue", "-h", "-o", "%i %o %Z"]
    before = [j for j in subprocess.run(mine, env=env, capture_output=True, text=True).stdout.splitlines() if str(tmp_path) in j]
    done = torchhpc(env, "run", "-s", "slurm", "--nodes", "2", "missing.py", cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.startswith("Error: the program 'missing.py' does not exist")
    after = [j for j in subprocess.run(mine, env=env, capture_output=True, text=True).stdout.splitlines() if str(tmp_path) in j]
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


# --- local jobs in the background ----------------------------------------------------------------


@pytest.fixture()
def local_env(tmp_path: Path) -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHHPC_")}
    env.update(HOME=str(tmp_path), TORCHHPC_STATE_DIR=str(tmp_path / "state"))
    return env


def test_local_background_lifecycle(local_env: dict[str, str], tmp_path: Path) -> None:
    """run --background, then list / status / logs / wait, then cancel a second (sleeping) job."""
    hello = tmp_path / "hello.py"  # torch-free: the lifecycle is under test here, not the ranks
    hello.write_text("import os\nprint('hello from', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'])\n")
    done = torchhpc(local_env, "run", "--background", "-n", "2", str(hello), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    handle = re.search(r"Submitted (local:\w+)", done.stdout).group(1)  # type: ignore[union-attr]
    done = torchhpc(local_env, "wait", handle, cwd=tmp_path, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    st = json.loads(torchhpc(local_env, "status", "--json", handle, cwd=tmp_path).stdout)
    assert st["state"] == "COMPLETED" and st["exit_code"] == 0 and st["name"] == "hello"
    logs = torchhpc(local_env, "logs", handle, "--rank", "1", cwd=tmp_path).stdout
    assert logs.strip() == "hello from 1 of 2", logs
    listed = torchhpc(local_env, "list", cwd=tmp_path)  # the default scheduler: local
    assert listed.returncode == 0 and handle in listed.stdout and "COMPLETED" in listed.stdout

    sleeper = tmp_path / "sleeper.py"
    sleeper.write_text("import time\nprint('started', flush=True)\ntime.sleep(300)\n")
    done = torchhpc(local_env, "run", "--background", "--json", "-n", "2", str(sleeper), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    handle = json.loads(done.stdout)["handle"]
    try:
        for _ in range(100):
            if "started" in torchhpc(local_env, "logs", handle, cwd=tmp_path).stdout:
                break
            time.sleep(0.3)
        assert json.loads(torchhpc(local_env, "status", "--json", handle, cwd=tmp_path).stdout)["state"] == "RUNNING"
    finally:  # also when an assertion above failed: the sleeper must not outlive the test
        assert torchhpc(local_env, "cancel", handle, cwd=tmp_path).returncode == 0
    done = torchhpc(local_env, "wait", handle, "--timeout", "60", cwd=tmp_path)
    assert done.returncode != 0 and "CANCELLED" in done.stderr
    # No rank survives its job.
    ps = subprocess.run(["pgrep", "-f", str(sleeper)], capture_output=True, text=True)
    assert ps.stdout.strip() == "", ps.stdout


def test_readme_python_api_block_runs(local_env: dict[str, str], tmp_path: Path) -> None:
    """The README's Python API example, extracted and run as written (from the repository root)."""
    text = (REPO / "README.md").read_text()
    intro = text.index("Python API, the same objects the CLI uses:")
    start = text.index("```python\n", intro) + len("```python\n")
    code = text[start : text.index("```", start)]
    done = subprocess.run([sys.executable, "-c", code], env=local_env, cwd=REPO, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "COMPLETED" in done.stdout and "pi ≈ 3.14159" in done.stdout


def test_local_supervisor_killed_reads_failed(local_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A supervisor gone without writing a state (SIGKILL) is FAILED with a reason, never RUNNING forever."""
    import os
    import signal

    from torchhpc.resolve import build_spec
    from torchhpc.schedulers.local.jobs import LocalJobs, job_dir
    from torchhpc.schedulers.local.local import LocalScheduler

    monkeypatch.setenv("TORCHHPC_STATE_DIR", local_env["TORCHHPC_STATE_DIR"])
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sleeper.py").write_text("import time\nprint('up', flush=True)\ntime.sleep(120)\n")
    jobs = LocalJobs()
    job = jobs.submit(LocalScheduler().render(build_spec({}, ["sleeper.py"], {})))
    for _ in range(200):
        if "up" in jobs.logs(job):
            break
        time.sleep(0.1)
    assert jobs.status(job).state == "RUNNING"
    rec = json.loads((job_dir(job) / "record.json").read_text())
    os.kill(int(rec["pid"]), signal.SIGKILL)
    for _ in range(100):
        st = jobs.status(job)
        if st.terminal:
            break
        time.sleep(0.1)
    assert st.state == "FAILED" and "was killed before it recorded an end" in st.reason
    # SIGKILL gave the supervisor no chance to stop its ranks: stop them here, by PID (ours: cwd is tmp_path).
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and os.readlink(proc / "cwd") == str(tmp_path) and \
                    b"sleeper.py" in (proc / "cmdline").read_bytes():
                os.kill(int(proc.name), signal.SIGKILL)
        except OSError:
            pass
