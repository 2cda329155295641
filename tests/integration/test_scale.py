"""The env contract at scale: every launcher on a many-node dev cluster gives each rank the right geometry.

A throw-away dev cluster (its own namespaces, beside the shared one) with
``TORCHHPC_SCALE_NODES`` nodes (default 16) runs a torch-free program under
``torchhpc run -s slurm --launcher L`` with 4 ranks per node. Every rank
prints RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK MASTER_ADDR
MASTER_PORT and its host; the test checks distinct ranks 0..W-1, the local
ranks and group rank of every node, and one master for all.

torchrun starts one agent per node that imports torch (about 2 s of CPU each on
this 2-core machine), so it runs on ``TORCHHPC_SCALE_TORCHRUN_NODES`` (default 8).
The full size by hand (about 2 min for torchrun)::

    TORCHHPC_SCALE_NODES=32 TORCHHPC_SCALE_TORCHRUN_NODES=32 python -m pytest tests/integration/test_scale.py

Nothing is faked: real slurmctld/slurmd, srun, OpenMPI's mpirun and torchrun.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import cluster_of_its_own
from torchhpc import devcluster
from torchhpc.devcluster import ClusterState

# exclusive: a second cluster of 16 nodes on the same two cores would slow every test beside it
pytestmark = [pytest.mark.cluster("slurm"), pytest.mark.slow, pytest.mark.exclusive]

NODES = int(os.environ.get("TORCHHPC_SCALE_NODES", "16"))
TORCHRUN_NODES = min(NODES, int(os.environ.get("TORCHHPC_SCALE_TORCHRUN_NODES", "8")))
PER_NODE = 4
KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")
GEOMETRY = f"""\
import os, socket
KEYS = {KEYS!r}
print("GEOM " + " ".join(f"{{k}}={{os.environ.get(k, '-')}}" for k in KEYS) + f" HOST={{socket.gethostname()}} ;", flush=True)
"""
# A record, wherever it sits: mpirun may splice another rank's output into a line (tokens, not lines).
RECORD = re.compile(r"GEOM " + " ".join(rf"{k}=(\S+)" for k in KEYS) + r" HOST=(\S+) ;")


@pytest.fixture(scope="module")
def big_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterState]:
    with cluster_of_its_own(tmp_path_factory, "scale", NODES) as state:
        yield state


def parse(text: str) -> list[dict[str, str]]:
    return [dict(zip((*KEYS, "HOST"), m)) for m in RECORD.findall(text)]


def check_geometry(records: list[dict[str, str]], nodes: int, per_node: int) -> None:
    world = nodes * per_node
    assert len(records) == world, f"{len(records)} records for {world} ranks"
    assert sorted(int(r["RANK"]) for r in records) == list(range(world))
    assert {r["WORLD_SIZE"] for r in records} == {str(world)}
    assert {r["LOCAL_WORLD_SIZE"] for r in records} == {str(per_node)}
    assert len({(r["MASTER_ADDR"], r["MASTER_PORT"]) for r in records}) == 1, "more than one master"
    by_host: dict[str, list[dict[str, str]]] = {}
    for r in records:
        by_host.setdefault(r["HOST"], []).append(r)
    assert len(by_host) == nodes, sorted(by_host)
    groups = set()
    for host, rs in by_host.items():
        assert sorted(int(r["LOCAL_RANK"]) for r in rs) == list(range(per_node)), host
        node_groups = {int(r["GROUP_RANK"]) for r in rs}
        assert len(node_groups) == 1, f"{host} has group ranks {node_groups}"
        group = node_groups.pop()
        groups.add(group)
        for r in rs:  # block order, as torchrun numbers ranks
            assert int(r["RANK"]) == group * per_node + int(r["LOCAL_RANK"]), r
    assert groups == set(range(nodes))


def run_geometry(cluster: ClusterState, launcher: str, nodes: int, tmp_path: Path) -> list[dict[str, str]]:
    prog = tmp_path / "geometry.py"
    prog.write_text(GEOMETRY)
    r = subprocess.run(
        [sys.executable, "-m", "torchhpc", "run", "-s", "slurm", "-N", str(nodes), "--nproc-per-node",
         str(PER_NODE), "--launcher", launcher, "--output-dir", str(tmp_path / "out"), "--name",
         f"geometry-{launcher}", "--wait", "--", sys.executable, str(prog)],
        env=cluster.client_env(), cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return parse(r.stdout)


@pytest.mark.parametrize("launcher", ["srun", "mpirun", "torchrun"])
def test_geometry_under_each_launcher(big_cluster: ClusterState, launcher: str, tmp_path: Path) -> None:
    nodes = TORCHRUN_NODES if launcher == "torchrun" else NODES
    check_geometry(run_geometry(big_cluster, launcher, nodes, tmp_path), nodes, PER_NODE)


def test_status_shows_every_node_with_its_memory(big_cluster: ClusterState) -> None:
    info = devcluster.status(big_cluster.state_dir)
    assert len(info["nodes"]) == NODES
    assert all(n["state"] == "idle" or n["state"].startswith(("mix", "alloc")) for n in info["nodes"]), info
    assert all(isinstance(n["memory_mb"], int) and n["memory_mb"] > 0 for n in info["nodes"]), info["nodes"]
    assert all(n["cpus"] == 4 for n in info["nodes"])


def test_check_geometry_catches_a_wrong_contract() -> None:
    """The checker itself fails on a duplicated rank and on a node with two group ranks."""
    good = [
        {"RANK": str(g * 2 + lr), "WORLD_SIZE": "4", "LOCAL_RANK": str(lr), "LOCAL_WORLD_SIZE": "2",
         "GROUP_RANK": str(g), "MASTER_ADDR": "n1", "MASTER_PORT": "1", "HOST": f"n{g}"}
        for g in range(2) for lr in range(2)
    ]  # fmt: skip
    check_geometry(good, 2, 2)
    dup = [dict(r) for r in good]
    dup[3]["RANK"] = "2"
    with pytest.raises(AssertionError):
        check_geometry(dup, 2, 2)
    split = [dict(r) for r in good]
    split[1]["GROUP_RANK"] = "1"
    with pytest.raises(AssertionError):
        check_geometry(split, 2, 2)
    # A spliced mpirun line still yields both records.
    line = "[1,0]<stdout>:GEOM " + " ".join(f"{k}={good[0][k]}" for k in KEYS) + " HOST=n0 ;[1,1]<stdout>:GEOM "
    line += " ".join(f"{k}={good[1][k]}" for k in KEYS) + " HOST=n0 ;\n"
    assert len(parse(line)) == 2
