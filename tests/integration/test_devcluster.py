"""The dev cluster is a real multi-node Slurm: jobs span namespaces, names
resolve, MPI starts across nodes, accounting records jobs.

All tests here use real daemons; nothing is faked. The shared cluster is never
torn down: the up/down test brings up its own throw-away cluster in a tmp dir.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import REPO, missing
from tests.integration.conftest import SlurmClient
from torchhpc import devcluster
from torchhpc.core.proc import Runner
from torchhpc.devcluster import ClusterState, daemons, netns

pytestmark = pytest.mark.cluster("slurm")


def test_srun_spans_three_nodes(slurm: SlurmClient, slurm_cluster: ClusterState) -> None:
    assert len(slurm_cluster.nodes) >= 3, "bring the cluster up with --nodes 4 (scripts/test.sh does)"
    out = slurm.run(["srun", "-N3", "hostname"]).stdout.split()
    assert len(out) == 3
    assert len(set(out)) == 3
    assert set(out) <= set(slurm_cluster.nodes)


def test_nodes_have_own_network_and_names(slurm: SlurmClient, slurm_cluster: ClusterState) -> None:
    """Each node sees its own hostname and address, and resolves the others (also in reverse)."""
    script = (
        'echo "$(hostname) $(cat /etc/hostname) $(getent ahostsv4 node1 | head -n1 | cut -d" " -f1)'
        ' $(getent hosts ctl | cut -d" " -f1)"'
    )
    out = slurm.run(["srun", "-N3", "--ntasks-per-node=1", "sh", "-c", script]).stdout
    rows = sorted(line.split() for line in out.splitlines() if line.strip())
    hosts = [r[0] for r in rows]
    # Slurm picks any three idle nodes: another test may hold node1 at this moment.
    assert len(set(hosts)) == 3 and set(hosts) <= set(slurm_cluster.nodes), hosts
    for host, etc_hostname, node1_ip, ctl_ip in rows:
        assert etc_hostname == host
        assert node1_ip == slurm_cluster.node_ip("node1")
        assert ctl_ip == slurm_cluster.node_ip("ctl")
    # torch's TCPStore reverse-resolves peers as IPv4-mapped IPv6: dnsmasq must answer.
    code = (
        "import socket; "
        f"print(socket.getnameinfo(('::ffff:{slurm_cluster.node_ip('node2')}', 0), socket.NI_NAMEREQD)[0])"
    )
    name = slurm.run(["srun", "-N1", sys.executable, "-c", code]).stdout.strip()  # any node: one may be full
    assert name == "node2"


def test_two_node_sbatch_completes_and_sacct_records_it(slurm: SlurmClient, tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    job = slurm.sbatch(
        ["-N2", "--ntasks-per-node=1", "-o", str(out), "--wrap", "srun hostname"], cwd=str(tmp_path)
    )
    info = slurm.wait(job)
    assert info["JobState"] == "COMPLETED", info
    assert len(set(out.read_text().split())) == 2
    assert slurm.sacct_state(job) == "COMPLETED"


def test_mpirun_spans_two_nodes_inside_sbatch(slurm: SlurmClient, tmp_path: Path) -> None:
    """OpenMPI starts its daemons through Slurm (no ssh) and runs as root with client_env()'s OMPI_*."""
    out = tmp_path / "mpi.txt"
    script = tmp_path / "mpi.sh"
    script.write_text(
        "#!/bin/bash\n"
        "mpirun sh -c 'echo rank=$OMPI_COMM_WORLD_RANK size=$OMPI_COMM_WORLD_SIZE host=$(hostname)'\n"
    )
    job = slurm.sbatch(["-N2", "--ntasks-per-node=2", "-o", str(out), str(script)], cwd=str(tmp_path))
    info = slurm.wait(job)
    text = out.read_text()
    assert info["JobState"] == "COMPLETED", text
    rows = [dict(kv.split("=", 1) for kv in line.split()) for line in text.splitlines() if "rank=" in line]
    assert sorted(int(r["rank"]) for r in rows) == [0, 1, 2, 3]
    assert {r["size"] for r in rows} == {"4"}
    assert len({r["host"] for r in rows}) == 2


def test_srun_pmix_gives_each_task_a_rank(slurm: SlurmClient) -> None:
    out = slurm.run(
        ["srun", "--mpi=pmix", "-N2", "--ntasks-per-node=2", "sh", "-c", "echo $PMIX_RANK"]
    ).stdout.split()
    assert sorted(out) == ["0", "1", "2", "3"]


def test_jobs_run_this_checkout_python(slurm: SlurmClient) -> None:
    """Nodes share the host filesystem: the venv's python and the package import on every node."""
    code = "import torchhpc, socket; print(socket.gethostname(), torchhpc.__file__)"
    out = slurm.run(["srun", "-N2", sys.executable, "-c", code], cwd=str(REPO)).stdout
    files = {line.split()[1] for line in out.splitlines()}
    assert files == {str(REPO / "src" / "torchhpc" / "__init__.py")}


def test_up_refuses_when_already_up(slurm_cluster: ClusterState) -> None:
    cp = subprocess.run(
        [sys.executable, "-m", "torchhpc", "devcluster", "up", "--state-dir", slurm_cluster.state_dir],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cp.returncode == 1
    assert "already up" in cp.stderr
    assert "torchhpc devcluster down" in cp.stderr
    assert devcluster.load_state(slurm_cluster.state_dir) is not None


@pytest.mark.slow
def test_throwaway_cluster_up_and_down(tmp_path: Path) -> None:
    """A second 2-node cluster beside the shared one, with a login node: up, run, ssh, down twice;
    nothing left behind (sshd and the login namespace go with the rest)."""
    if os.geteuid() != 0 or not sys.platform.startswith("linux"):
        missing("bringing up a dev cluster needs root on Linux")
    # Not under tmp_path: xdist's worker folder made slurmd's step socket paths longer than a unix socket
    # may be, and the batch job ended "launch failed requeued held" (devcluster up now refuses such a dir).
    sdir = tempfile.mkdtemp(prefix="thpc-dc-")
    runner = Runner()
    state = devcluster.up(nodes=2, state_dir=sdir, progress=None, login=True)
    try:
        assert devcluster.load_state(sdir) is not None
        assert "sshd" in [d.name for d in state.daemons] and state.netns("login").endswith("-login")
        ssh = subprocess.run([sys.executable, "-m", "torchhpc", "devcluster", "ssh", "--state-dir", sdir, "--",
                              "sh", "-c", "hostname; echo $SLURM_CONF; sinfo -h -o %D"],
                             capture_output=True, text=True, timeout=60)
        assert ssh.stdout.split() == ["login", state.slurm_conf, "2"], ssh.stderr
        assert state.netns("ctl") != "torchhpc-ctl"  # its own namespaces, not the shared cluster's
        cp = subprocess.run(
            ["srun", "-N2", "hostname"], env=state.client_env(), capture_output=True, text=True, timeout=60
        )
        assert sorted(cp.stdout.split()) == ["node1", "node2"], cp.stderr
        # A job still running at `down` must not outlive the cluster.
        runner.run(
            ["sbatch", "-N1", "-o", "/dev/null", "--wrap", f"sleep {LONG_SLEEP}"], env=state.client_env()
        )
        if not _wait_until(lambda: _sleepers() != []):
            queue = subprocess.run(["squeue", "-h", "-o", "%i %T %r %N"], env=state.client_env(),
                                   capture_output=True, text=True, timeout=30)
            nodes = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t %E"], env=state.client_env(),
                                   capture_output=True, text=True, timeout=30)
            pytest.fail(f"the job never started a sleep: queue {queue.stdout.strip()!r}, nodes {nodes.stdout.strip()!r}")
    finally:
        devcluster.down(sdir, progress=None)
    assert devcluster.load_state(sdir) is None
    assert not any(daemons.alive(d) for d in state.daemons)
    assert netns.existing(f"torchhpc-{state.netns('ctl').split('-')[1]}", runner) == []
    assert devcluster.down(sdir, progress=None) == []  # idempotent
    assert _sleepers() == []
    shutil.rmtree(sdir, ignore_errors=True)


def test_up_refuses_a_state_dir_too_long_for_step_sockets(tmp_path: Path) -> None:
    sdir = tmp_path / ("d" * 80)
    cp = subprocess.run([sys.executable, "-m", "torchhpc", "devcluster", "up", "--state-dir", str(sdir)],
                        capture_output=True, text=True, timeout=60)
    assert cp.returncode != 0 and "too long for Slurm's step sockets" in cp.stderr, cp.stderr
    assert "Traceback" not in cp.stderr


LONG_SLEEP = "271828"


def _sleepers() -> list[int]:
    """PIDs running our marker ``sleep`` (read-only scan; nothing is signalled here)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv[:2] == [b"sleep", LONG_SLEEP.encode()]:
            found.append(int(entry))
    return found


def _wait_until(check: Callable[[], bool], timeout: float = 60) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return False
