"""Rendering and parsing at real sizes: 1024-node hostlists, heterogeneous
SLURM_TASKS_PER_NODE, the env detection and the bash task shim on such jobs.

Nothing is timed here (a time bound lives in benchmarks/render_scale.py); the
shim runs in a real bash, the way srun starts it.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.fakes import FakeRunner
from torchhpc.core.hostlist import compress, expand, first_host, read_nodefile
from torchhpc.core.spec import Entrypoint, JobSpec
from torchhpc.env import detect, tasks_per_node
from torchhpc.launchers.boot import task_argv
from torchhpc.schedulers.slurm.slurm import SlurmScheduler

HETERO = "4(x1000),2(x24)"  # 1024 nodes, 4048 tasks
NODES_1024 = "gpu[0001-1024]"


def test_1024_node_hostlist_expands_in_order_and_compresses_back() -> None:
    hosts = expand(NODES_1024)
    assert len(hosts) == 1024 and len(set(hosts)) == 1024
    assert hosts[:2] == ["gpu0001", "gpu0002"] and hosts[998:1001] == ["gpu0999", "gpu1000", "gpu1001"]
    assert hosts[-1] == "gpu1024"
    assert first_host(NODES_1024) == "gpu0001"
    # One range, as Slurm writes it: gpu1000..gpu1024 are four-digit names of the same padded range.
    assert compress(hosts) == NODES_1024


@pytest.mark.parametrize(
    "text",
    [
        "gpu[0001-0512,0600-1111]",
        "rack[1-32]-node[01-32]",  # 32 x 32, Slurm's cartesian form
        "a[001-999],b[1-25],login1",
        "nid[000001-001024]",
    ],
)
def test_1024_node_hostlists_roundtrip(text: str) -> None:
    hosts = expand(text)
    assert len(hosts) >= 1000 and len(set(hosts)) == len(hosts)
    again = expand(compress(hosts))
    assert len(again) == len(hosts) and set(again) == set(hosts)


def test_cartesian_hostlist_order() -> None:
    hosts = expand("rack[1-32]-node[01-32]")
    assert hosts[:3] == ["rack1-node01", "rack1-node02", "rack1-node03"]
    assert hosts[32] == "rack2-node01" and hosts[-1] == "rack32-node32"


def test_heterogeneous_tasks_per_node() -> None:
    counts = tasks_per_node(HETERO)
    assert len(counts) == 1024 and sum(counts) == 4048
    assert counts[999] == 4 and counts[1000] == 2 and counts[-1] == 2
    assert tasks_per_node("2(x3),1,8(x2)") == [2, 2, 2, 1, 8, 8]


def _slurm_task(node_id: int, local_id: int, per_node: list[int]) -> dict[str, str]:
    """The variables srun gives one task of a 1024-node block-distributed step."""
    rank = sum(per_node[:node_id]) + local_id
    return {
        "SLURM_JOB_ID": "4242",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": str(local_id),
        "SLURM_NODEID": str(node_id),
        "SLURM_NTASKS": str(sum(per_node)),
        "SLURM_STEP_NUM_TASKS": str(sum(per_node)),
        "SLURM_STEP_NUM_NODES": str(len(per_node)),
        "SLURM_NNODES": str(len(per_node)),
        "SLURM_STEP_TASKS_PER_NODE": HETERO,
        "SLURM_TASKS_PER_NODE": HETERO,
        "SLURM_STEP_NODELIST": NODES_1024,
        "SLURM_JOB_NODELIST": NODES_1024,
    }


# (node id, local id) samples across both groups and their edges.
SAMPLES = [(0, 0), (0, 3), (1, 2), (511, 1), (999, 3), (1000, 0), (1000, 1), (1013, 1), (1023, 0), (1023, 1)]


@pytest.mark.parametrize(("node_id", "local_id"), SAMPLES)
def test_detection_on_a_1024_node_heterogeneous_step(node_id: int, local_id: int) -> None:
    per_node = tasks_per_node(HETERO)
    env = _slurm_task(node_id, local_id, per_node)
    d = detect(env)
    assert d.source == "slurm"
    assert (d.rank, d.world_size) == (int(env["SLURM_PROCID"]), 4048)
    assert (d.local_rank, d.local_world_size) == (local_id, per_node[node_id])
    assert (d.node_rank, d.num_nodes) == (node_id, 1024)
    assert d.master_addr == "gpu0001"


def _run_shim(env: dict[str, str]) -> dict[str, str]:
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    out = subprocess.run(
        task_argv(["env"]), env={**base, **env}, capture_output=True, text=True, timeout=30, check=True
    ).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


@pytest.mark.parametrize(("node_id", "local_id"), SAMPLES)
def test_task_shim_local_world_size_on_1024_nodes(node_id: int, local_id: int) -> None:
    per_node = tasks_per_node(HETERO)
    env = _slurm_task(node_id, local_id, per_node)
    got = _run_shim(env)
    assert got["RANK"] == env["SLURM_PROCID"] and got["WORLD_SIZE"] == "4048"
    assert got["LOCAL_RANK"] == str(local_id)
    assert got["LOCAL_WORLD_SIZE"] == str(per_node[node_id])


@pytest.mark.parametrize(("node_id", "local_id"), [(0, 1), (999, 3), (1000, 0), (1023, 1)])
def test_task_shim_group_rank_on_1024_nodes(node_id: int, local_id: int) -> None:
    """GROUP_RANK must be the node's index (torchrun's meaning), also where nodes run unequal task counts."""
    per_node = tasks_per_node(HETERO)
    got = _run_shim(_slurm_task(node_id, local_id, per_node))
    assert got["GROUP_RANK"] == str(node_id)


def test_slurm_render_1024_nodes() -> None:
    s = SlurmScheduler(runner=FakeRunner())
    for launcher in ("torchrun", "srun", "mpirun"):
        job = JobSpec(
            Entrypoint.parse(["train.py"], python="python3"), nodes=1024, nproc_per_node=4,
            scheduler="slurm", launcher=launcher, name="big", output_dir="/scratch/out",
        )  # fmt: skip
        script = s.render(job).script or ""
        assert "#SBATCH --nodes=1024" in script, script
        # Nothing in the script grows with the node count: the ranks come from Slurm at run time.
        assert len(script) < 20_000


def test_pbs_nodefile_of_1024_nodes() -> None:
    hosts = expand(NODES_1024)
    text = "".join(f"{h}\n" * 4 for h in hosts)  # one line per slot, 4 slots per node
    assert read_nodefile(text) == hosts
