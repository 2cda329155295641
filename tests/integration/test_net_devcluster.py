"""Interface selection, the transport check and doctor, for real.

Local part (no cluster): two real gloo ranks on this machine, started by
``net check``; the interface they used is read back from their own TCP
connections. Cluster part: the dev cluster's nodes are network namespaces
where only ``eth0`` routes to the controller and the other nodes (and ``lo``
exists too), so detection must pick ``eth0``; a 2-node job runs the gloo
check across nodes and ``doctor --in-job`` inside a job step. No RDMA
hardware exists here: the fabric side is covered by tests/unit on fake trees.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import PYTHON, REPO
from tests.integration.conftest import SlurmClient
from torchhpc.devcluster import ClusterState

ENV = {**os.environ, "PYTHONPATH": str(REPO / "src")}


def _json_lines(text: str, prefix: str = "TORCHHPC_CHECK ") -> list[dict[str, object]]:
    return [json.loads(line[len(prefix):]) for line in text.splitlines() if line.startswith(prefix)]


@pytest.mark.slow
def test_local_gloo_check_reports_loopback() -> None:
    done = subprocess.run(
        [PYTHON, "-m", "torchhpc", "net", "check", "--backend", "gloo", "--json"],
        capture_output=True, text=True, env=ENV, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads(done.stdout)
    assert data["status"] == "pass"
    assert [r["rank"] for r in data["ranks"]] == [0, 1]
    for r in data["ranks"]:
        assert r["ok"] and r["sum"] == r["expected"] == 3.0
        assert r["ifaces"] == ["lo"]  # MASTER_ADDR=127.0.0.1: gloo binds loopback
        assert r["connections"], r


def _nsenter(cluster: ClusterState, node: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["nsenter", f"--net=/run/netns/{cluster.netns(node)}", PYTHON, "-m", "torchhpc", *args],
        capture_output=True, text=True, env=ENV, timeout=120,
    )


@pytest.mark.cluster("slurm")
def test_detect_in_a_node_namespace_picks_eth0(slurm_cluster: ClusterState) -> None:
    node = slurm_cluster.nodes[0]
    for master in (slurm_cluster.controller_ip, slurm_cluster.node_ip(slurm_cluster.nodes[1])):
        done = _nsenter(slurm_cluster, node, "net", "detect", "--master", master, "--json")
        assert done.returncode == 0, done.stderr
        data = json.loads(done.stdout)
        assert data["env"]["NCCL_SOCKET_IFNAME"] == "eth0", data
        assert data["env"]["GLOO_SOCKET_IFNAME"] == "eth0"
        assert "NCCL_IB_HCA" not in data["env"]
    # Only when the master is the node itself may loopback be chosen.
    done = _nsenter(slurm_cluster, node, "net", "detect", "--master", "127.0.0.1", "--json")
    assert json.loads(done.stdout)["env"]["NCCL_SOCKET_IFNAME"] == "lo"


_FIRST_HOST = 'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)'


def _batch(slurm: SlurmClient, tmp_path: Path, body: str, nodes: int = 2) -> str:
    """Run ``body`` as a batch script on ``nodes`` nodes (whichever are free); return its output."""
    script = tmp_path / "job.sh"
    out = tmp_path / "out.txt"
    script.write_text(f"#!/bin/bash\nset -eu\nexport PYTHONPATH={REPO / 'src'}\n{body}\n")
    job = slurm.sbatch([f"-N{nodes}", "--ntasks-per-node=1", "-o", str(out), str(script)], cwd=str(tmp_path))
    info = slurm.wait(job, timeout=600)
    text = out.read_text() if out.exists() else ""
    assert info["JobState"] == "COMPLETED", text
    return text


@pytest.mark.cluster("slurm")
def test_export_inside_a_job_sets_eth0_unless_the_user_did(slurm: SlurmClient, tmp_path: Path) -> None:
    step = (
        'eval "$("$0" -m torchhpc net detect --export --master "$MASTER_ADDR")"; '
        'echo "row $(hostname) $NCCL_SOCKET_IFNAME $GLOO_SOCKET_IFNAME"'
    )
    body = (
        f"export {_FIRST_HOST}\n"
        f"srun bash -c '{step}' {PYTHON}\n"
        f"NCCL_SOCKET_IFNAME=mine0 srun -N1 -n1 bash -c '{step}' {PYTHON}\n"
    )
    out = _batch(slurm, tmp_path, body)
    rows = [line.split()[1:] for line in out.splitlines() if line.startswith("row ")]
    # The first node is the master itself (its own address is local: eth0 holds it); the other routes via eth0.
    assert len(rows) == 3, out
    assert len({r[0] for r in rows[:2]}) == 2
    assert [r[1:] for r in rows[:2]] == [["eth0", "eth0"], ["eth0", "eth0"]], out
    assert rows[2][1:] == ["mine0", "eth0"]  # the user's value wins


@pytest.mark.cluster("slurm")
@pytest.mark.slow
def test_gloo_check_across_two_nodes_uses_eth0(
    slurm: SlurmClient, slurm_cluster: ClusterState, tmp_path: Path
) -> None:
    port = 20000 + os.getpid() % 20000
    body = (
        f"export {_FIRST_HOST} MASTER_PORT={port}\n"
        f"srun {PYTHON} -m torchhpc net check --in-job\n"
    )
    out = _batch(slurm, tmp_path, body)
    reports = sorted(_json_lines(out), key=lambda r: int(str(r["rank"])))
    assert [r["rank"] for r in reports] == [0, 1], out
    hosts = {str(r["host"]) for r in reports}
    assert len(hosts) == 2 and hosts <= set(slurm_cluster.nodes)
    ips = {slurm_cluster.node_ip(h) for h in hosts}
    for r in reports:
        assert r["ok"] and r["world_size"] == 2
        assert r["ifaces"] == ["eth0"], r
        assert {c["remote"] for c in r["connections"]} <= ips, r  # type: ignore[union-attr]


@pytest.mark.cluster("slurm")
def test_doctor_inside_a_job_step(slurm: SlurmClient, tmp_path: Path) -> None:
    body = (
        f"export {_FIRST_HOST} MASTER_PORT=29511\n"
        f"srun {PYTHON} -m torchhpc doctor --in-job --json > {tmp_path / 'doctor.json'} || true\n"
    )
    _batch(slurm, tmp_path, body, nodes=1)
    data = json.loads((tmp_path / "doctor.json").read_text())
    by = {c["name"]: c for c in data["checks"]}
    assert data["in_job"] is True
    assert by["torch"]["status"] == "pass" and "gloo" in by["torch"]["detail"]
    assert by["gpus"]["status"] == "warn"  # no GPU in the dev cluster, none requested
    # The master is this node: its own address, on eth0 (never a virtual interface).
    assert by["interface"]["status"] == "pass" and by["interface"]["detail"].startswith("eth0"), by["interface"]
    assert by["port"]["status"] == "pass" and "29511" in by["port"]["detail"]
    assert by["slurm"]["status"] == "pass" and "UP" in by["slurm"]["detail"]
    assert by["geometry"]["status"] == "pass", by["geometry"]
    assert PYTHON in by["python"]["detail"] or sys.executable in by["python"]["detail"]
    assert data["ok"] == (not any(c["status"] == "fail" for c in data["checks"]))
