"""The slurm scheduler against the real dev cluster (slurmctld + 3 slurmd in network namespaces).

Nothing here is faked: sbatch, srun, torchrun and OpenMPI's mpirun really start
ranks on two namespace nodes that talk gloo over veth.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.cli_run import torchhpc
from tests.conftest import HOSTILE, REPO

pytestmark = pytest.mark.cluster("slurm")
PI = str(REPO / "examples" / "pi.py")


def sacct_state(cluster: Any, job_id: str, timeout: float = 30) -> str:
    """sacct sees a finished job a few seconds late: poll."""
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        out = subprocess.run(
            ["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "State"],
            env=cluster.client_env(), capture_output=True, text=True, timeout=30,
        ).stdout.strip()
        state = out.split()[0] if out else ""
        if state and state not in ("PENDING", "RUNNING", "COMPLETING"):
            return state
        time.sleep(1)
    return state


def job_id_of(stdout: str) -> str:
    m = re.search(r"Submitted slurm:(\d+)", stdout)
    assert m, stdout
    return m.group(1)


@pytest.mark.parametrize("launcher", ["torchrun", "srun", "mpirun"])
def test_pi_two_nodes_each_launcher(slurm_cluster: Any, launcher: str, tmp_path: Path) -> None:
    r = torchhpc(
        slurm_cluster, "run", "--scheduler", "slurm", "--nodes", "2", "--nproc-per-node", "2",
        "--launcher", launcher, "--output-dir", str(tmp_path), "--name", f"pi-{launcher}",
        PI, "--steps", "2000000", "--wait", cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    ranks = set(re.findall(r"rank (\d+)/4", r.stdout))
    assert ranks == {"0", "1", "2", "3"}, r.stdout
    hosts = set(re.findall(r"rank \d+/4 on (node\d)", r.stdout))
    assert len(hosts) == 2, r.stdout
    err = float(re.search(r"error\s*[=:]?\s*([0-9.eE+-]+)", r.stdout).group(1))  # type: ignore[union-attr]
    assert err < 1e-10
    assert sacct_state(slurm_cluster, job_id_of(r.stdout)) == "COMPLETED"


@pytest.mark.parametrize(("launcher", "code", "why"), [
    ("srun", "sys.exit(3)", 3), ("srun", "os.abort()", 134), ("torchrun", "sys.exit(3)", 3), ("torchrun", "os.abort()", 134),
])
def test_failing_job_surfaces_the_ranks_own_exit_code(
    slurm_cluster: Any, tmp_path: Path, launcher: str, code: str, why: int
) -> None:
    """Rank 1 fails while rank 0 still sleeps. srun's --kill-on-bad-exit stops the rest with SIGTERM, and
    the launcher's own status hides rank 1's code: srun's is its tasks' highest, 143; torchrun's is 1. The
    job ends with rank 1's own code instead, everywhere: the shell of run --wait, status, wait, and Slurm's
    record (sacct's ExitCode, from the batch shell's status)."""
    prog = f"import os,sys,time; time.sleep(30) if os.environ['RANK']=='0' else {code}"
    r = torchhpc(
        slurm_cluster, "run", "-s", "slurm", "-N", "2", "--nproc-per-node", "1", "--launcher", launcher,
        "--output-dir", str(tmp_path), "--name", "fails", "--wait", "--", sys.executable, "-c", prog, cwd=tmp_path,
    )
    job = job_id_of(r.stdout)
    assert r.returncode == why, r.stdout + r.stderr
    st = torchhpc(slurm_cluster, "status", f"slurm:{job}", "--json", cwd=tmp_path)
    data = json.loads(st.stdout)
    assert data["state"] == "FAILED" and data["exit_code"] == why, st.stdout
    w = torchhpc(slurm_cluster, "wait", f"slurm:{job}", cwd=tmp_path)
    assert w.returncode == why and f"FAILED with exit code {why}" in w.stderr, w.stderr
    acct = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job, "-o", "ExitCode"], env=slurm_cluster.client_env(),
                          capture_output=True, text=True, timeout=60).stdout.split()
    # not the SIGTERM srun sent rank 0, nor torchrun's 1 (Slurm writes 134 as 6:0)
    assert acct and acct[0] not in ("15:0", "1:0"), acct
    out = (tmp_path / f"fails-{job}" / "slurm.out").read_text()
    if launcher == "srun":
        assert "Terminated" in out, out  # rank 0 was stopped: srun's 143
    else:
        assert "Root Cause (first observed failure)" in out and "Exited with exit code 1" in out, out  # torchrun's 1


def _procs_with(marker: str) -> list[str]:
    # the nodes share the host's PID namespace, so one pgrep sees every node
    out = subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "pgrep" not in line]


def test_cancel_running_job_leaves_no_processes(slurm_cluster: Any, tmp_path: Path) -> None:
    marker = f"torchhpc_cancel_marker_{os.getpid()}"
    script = tmp_path / f"{marker}.py"
    script.write_text("import time, torch.distributed as d\nd.init_process_group('gloo')\nprint('up', flush=True)\ntime.sleep(300)\n")
    r = torchhpc(
        slurm_cluster, "run", "-s", "slurm", "-N", "2", "--nproc-per-node", "2", "--launcher", "torchrun",
        "--output-dir", str(tmp_path), str(script), cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    job = job_id_of(r.stdout)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and len(_procs_with(marker)) < 6:  # 2 torchrun + 4 workers
            time.sleep(1)
        assert len(_procs_with(marker)) >= 6, _procs_with(marker)
        assert torchhpc(slurm_cluster, "cancel", f"slurm:{job}", cwd=tmp_path).returncode == 0
        w = torchhpc(slurm_cluster, "wait", f"slurm:{job}", "--timeout", "60", cwd=tmp_path)
        assert "CANCELLED" in w.stderr, w.stderr
    finally:  # an assertion above must not leave the job running
        subprocess.run(["scancel", job], env=slurm_cluster.client_env(), capture_output=True, timeout=60)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _procs_with(marker):
        time.sleep(0.5)
    assert _procs_with(marker) == []


def test_logs_by_rank(slurm_cluster: Any, tmp_path: Path) -> None:
    r = torchhpc(
        slurm_cluster, "run", "-s", "slurm", "-N", "2", "--nproc-per-node", "2", "--launcher", "srun",
        "--output-dir", str(tmp_path), "--wait", "--", sys.executable, "-c",
        "import os; print('hello from', os.environ['RANK'], os.environ['LOCAL_RANK'], os.environ['WORLD_SIZE'])",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    job = job_id_of(r.stdout)
    one = torchhpc(slurm_cluster, "logs", f"slurm:{job}", "--rank", "3", cwd=tmp_path).stdout
    assert one == "hello from 3 1 4\n"  # exactly its line, as the rank printed it (docs/logs.md)


def test_hostile_names_paths_and_args(slurm_cluster: Any, tmp_path: Path) -> None:
    """The job sees exactly the argv given, whatever the quoting, and nothing else runs."""
    outdir = tmp_path / "out dir $(touch pwned) 'q'"
    outdir.mkdir()
    args = [v for v in HOSTILE]
    name = "job \"x\" $(touch pwned) #1 'y'"
    r = torchhpc(
        slurm_cluster, "run", "-s", "slurm", "-N", "1", "-n", "1", "--launcher", "srun",
        "--output-dir", str(outdir), "--name", name, "--env", "HOSTILE_ENV=a'b \"c\" $(touch pwned2)",
        "--wait", "--", sys.executable, "-c",
        "import sys, json, os; print('ARGV=' + json.dumps(sys.argv[1:]));"
        "print('ENV=' + json.dumps(os.environ['HOSTILE_ENV']))",
        *args, cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    argv_line = next(line for line in r.stdout.splitlines() if "ARGV=" in line)
    assert json.loads(argv_line.split("ARGV=", 1)[1]) == args
    env_line = next(line for line in r.stdout.splitlines() if "ENV=" in line)
    assert json.loads(env_line.split("ENV=", 1)[1]) == "a'b \"c\" $(touch pwned2)"
    job = job_id_of(r.stdout)
    st = json.loads(torchhpc(slurm_cluster, "status", f"slurm:{job}", "--json", cwd=tmp_path).stdout)
    assert st["name"] in (name, name.split()[0])  # scontrol's -o output splits names on spaces
    for d in (tmp_path, outdir, REPO):
        assert not list(Path(d).glob("pwned*")), f"something executed in {d}"
