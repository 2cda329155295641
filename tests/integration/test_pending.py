"""`torchhpc status` of a pending job on the real dev cluster: each way to wait gives its category and evidence.

Every test makes a job wait for real (a job holding every node, a dependency, a hold, a QOS limit set
with sacctmgr, a partition set down) and undoes what it changed (jobs, QOS, partition state).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import missing
from tests.integration.conftest import SlurmClient

# Every node taken, a QOS added, a partition set down: nothing else may submit meanwhile.
pytestmark = pytest.mark.exclusive


def status(slurm: SlurmClient, job: str) -> dict[str, Any]:
    r = subprocess.run([sys.executable, "-m", "torchhpc", "status", f"slurm:{job}", "--json"], env=slurm.env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out: dict[str, Any] = json.loads(r.stdout)
    return out


def text_status(slurm: SlurmClient, job: str) -> str:
    r = subprocess.run([sys.executable, "-m", "torchhpc", "status", f"slurm:{job}"], env=slurm.env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def sbatch(slurm: SlurmClient, *args: str) -> str:
    """Submit a held or pending job; its output goes nowhere (sbatch's default, slurm-N.out in the
    current directory, once left eight such files in the repository root)."""
    return slurm.run(["sbatch", "--parsable", "-t", "5", "--output=/dev/null", *args]).stdout.strip().split(";")[0]


def pending(slurm: SlurmClient, job: str, reason: str) -> dict[str, Any]:
    """The job's status once Slurm gives it ``reason`` (the scheduler evaluates a new job within seconds)."""
    deadline = time.monotonic() + 60
    while True:
        st = status(slurm, job)
        if (st["state"] == "PENDING" and st["reason"] == reason) or time.monotonic() > deadline:
            assert st["state"] == "PENDING" and st["reason"] == reason, st
            return st
        time.sleep(1)


@pytest.fixture
def jobs(slurm: SlurmClient) -> Iterator[list[str]]:
    made: list[str] = []
    yield made
    if made:
        slurm.run(["scancel", *made], check=False)


@pytest.mark.cluster("slurm")
def test_every_node_taken_is_resources(slurm: SlurmClient, jobs: list[str]) -> None:
    jobs.append(sbatch(slurm, "-N4", "--exclusive", "-J", "hog", "--wrap", "sleep 300"))
    jobs.append(sbatch(slurm, "-N2", "-J", "want2", "--wrap", "true"))
    p = pending(slurm, jobs[1], "Resources")["pending"]
    assert p["category"] == "resources"
    text = "\n".join(p["evidence"])
    assert "0 idle, 4 allocated" in text and f"job {jobs[0]} (hog, root, 4 nodes" in text, p
    assert text_status(slurm, jobs[1]).splitlines()[1].startswith("pending: waiting for nodes")


@pytest.mark.cluster("slurm")
def test_dependency_on_a_running_job(slurm: SlurmClient, jobs: list[str]) -> None:
    jobs.append(sbatch(slurm, "-N1", "-J", "first", "--wrap", "sleep 300"))
    jobs.append(sbatch(slurm, "-N1", f"--dependency=afterok:{jobs[0]}", "--wrap", "true"))
    p = pending(slurm, jobs[1], "Dependency")["pending"]
    assert p["category"] == "dependency"
    assert any(e.startswith(f"dependency afterok:{jobs[0]}: job {jobs[0]} (first) is") for e in p["evidence"]), p


@pytest.mark.cluster("slurm")
@pytest.mark.parametrize("how", ["--hold", "scontrol hold"])
def test_held(slurm: SlurmClient, jobs: list[str], how: str) -> None:
    if how == "--hold":
        jobs.append(sbatch(slurm, "-N1", "--hold", "--wrap", "true"))
    else:
        jobs.append(sbatch(slurm, "-N1", "--begin=now+600", "--wrap", "true"))
        slurm.run(["scontrol", "hold", jobs[0]])
    p = pending(slurm, jobs[0], "JobHeldUser" if how == "--hold" else "JobHeldAdmin")["pending"]
    assert p["category"] == "held"
    if how == "--hold":
        assert p["action"] == f"scontrol release {jobs[0]}"
    else:  # root's scontrol hold is an admin hold: a user's release would be refused, so no action
        assert p["summary"] == "held by an administrator" and p["action"] is None, p


@pytest.fixture
def qos(slurm: SlurmClient) -> Iterator[str]:
    """A QOS allowing 2 CPUs per user, usable by root; removed after the test."""
    if not slurm.state.accounting:
        missing("needs `torchhpc devcluster up --accounting`")
    name = "thpcpend"
    slurm.run(["sacctmgr", "-i", "add", "qos", name, "MaxTRESPerUser=cpu=2"], check=False)
    slurm.run(["sacctmgr", "-i", "modify", "qos", name, "set", "MaxTRESPerUser=cpu=2"])
    slurm.run(["sacctmgr", "-i", "modify", "user", "root", "set", f"qos+={name}"])
    yield name
    slurm.run(["sacctmgr", "-i", "modify", "user", "root", "set", f"qos-={name}"], check=False)
    slurm.run(["sacctmgr", "-i", "delete", "qos", name], check=False)


@pytest.mark.cluster("slurm")
def test_qos_limit_is_named(slurm: SlurmClient, jobs: list[str], qos: str) -> None:
    jobs.append(sbatch(slurm, f"--qos={qos}", "-n2", "-J", "using2", "--wrap", "sleep 300"))
    jobs.append(sbatch(slurm, f"--qos={qos}", "-n1", "--wrap", "true"))
    jobs.append(sbatch(slurm, f"--qos={qos}", "-n4", "--wrap", "true"))
    p = pending(slurm, jobs[1], "QOSMaxCpuPerUserLimit")["pending"]
    assert p["category"] == "limit" and p["summary"] == f"held back by QOS {qos}'s limit MaxTRESPerUser cpu=2", p
    assert p["action"] and f"job {jobs[0]}" in p["action"]
    p = pending(slurm, jobs[2], "QOSMaxCpuPerUserLimit")["pending"]
    assert p["category"] == "never" and "it alone asks cpu=4" in p["summary"], p


@pytest.fixture
def partition_down(slurm: SlurmClient) -> Iterator[str]:
    part = slurm.run(["sinfo", "-h", "-o", "%P"]).stdout.split()[0].rstrip("*")
    slurm.run(["scontrol", "update", f"PartitionName={part}", "State=DOWN"])
    yield part
    slurm.run(["scontrol", "update", f"PartitionName={part}", "State=UP"])


@pytest.mark.cluster("slurm")
def test_partition_down_is_never(slurm: SlurmClient, jobs: list[str], partition_down: str) -> None:
    jobs.append(sbatch(slurm, "-N1", "--wrap", "true"))
    p = pending(slurm, jobs[0], "PartitionDown")["pending"]
    assert p["category"] == "never" and p["summary"].endswith(f"partition {partition_down} is DOWN"), p


@pytest.mark.cluster("slurm")
def test_more_nodes_than_the_partition_is_never(slurm: SlurmClient, jobs: list[str]) -> None:
    n = len(slurm.run(["sinfo", "-h", "-N", "-o", "%N"]).stdout.split())
    jobs.append(sbatch(slurm, f"-N{n + 6}", "--wrap", "true"))
    p = pending(slurm, jobs[0], "PartitionNodeLimit")["pending"]
    assert p["category"] == "never" and f"it asks {n + 6} nodes" in p["summary"], p


@pytest.mark.cluster("slurm")
def test_a_partly_used_node_with_room_fits(slurm: SlurmClient, jobs: list[str]) -> None:
    """A blocker using 1 CPU per node on all but the last node, the last node full: a job of 1 CPU per node
    on every node waits (Resources), and the evidence counts the partly used nodes as fitting it."""
    names = slurm.run(["sinfo", "-h", "-N", "-o", "%N"]).stdout.split()
    jobs.append(sbatch(slurm, f"-N{len(names) - 1}", "--ntasks-per-node=1", "-w", ",".join(names[:-1]),
                       "-J", "blocker", "--wrap", "sleep 300"))
    jobs.append(sbatch(slurm, "-N1", "--exclusive", "-w", names[-1], "-J", "full", "--wrap", "sleep 300"))
    jobs.append(sbatch(slurm, f"-N{len(names)}", "--ntasks-per-node=1", "-J", "beside", "--wrap", "true"))
    p = pending(slurm, jobs[2], "Resources")["pending"]
    text = "\n".join(p["evidence"])
    assert f"0 idle, {len(names) - 1} partly used with room for it, 1 allocated" in text, p
