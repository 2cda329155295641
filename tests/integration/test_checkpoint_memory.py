"""Issue 68: the memory tier of torchhpc.dist.checkpoint with real ranks (FSDP2, gloo on CPU).

Four ranks under ``torchhpc run`` play two nodes of two (``TORCHHPC_NODE_NAME``); each node's shared memory
is a directory of its own under ``TORCHHPC_SHM_DIR``, as the dev cluster's namespace nodes keep theirs apart
(the peer copy goes over gloo between the ranks, as between real nodes). ``scripts/ckpt_memory.py`` saves to
memory every step and to disk at step 2 of 5, then a resume:

* on the same nodes: from this node's memory, step 5 (not the disk's 2), the full state bit-identical;
* after node ``n1`` is lost with its memory (its directory removed), on ``n0`` and a new node ``n2``: from
  the peer copies ``n0`` kept of ``n1``'s ranks, step 5, bit-identical;
* after both nodes' memory is lost: from disk, step 2.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import PYTHON, REPO, need
from tests.integration.test_shrink_reshard import same

torch = need("torch")
pytestmark = pytest.mark.slow

SCRIPT = str(REPO / "tests" / "integration" / "scripts" / "ckpt_memory.py")


def launch(root: Path, shm: Path, *args: str) -> None:
    cp = subprocess.run([PYTHON, "-m", "torchhpc", "run", "-n", "4", "--env", f"TORCHHPC_SHM_DIR={shm}",
                         "--env", "SLURM_JOB_ID=77", SCRIPT, str(root), *args],
                        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert cp.returncode == 0 and "DONE" in cp.stdout, cp.stdout + cp.stderr


def node_dirs(shm: Path) -> dict[str, Path]:
    return {d.name: d for d in shm.glob("torchhpc-77-*/*") if d.is_dir()}  # beside them: the tier's ``dir`` file


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("memtier")
    shm = d / "shm"
    launch(d, shm, "train", "n0,n0,n1,n1")
    nodes = node_dirs(shm)
    assert sorted(nodes) == ["n0", "n1"], nodes
    # at most two copies of a rank's part: each node's newest own checkpoint and its peer's
    assert sorted(p.name for p in nodes["n0"].iterdir()) == ["ckpt-000000005", "peer-000000005.to-0",
                                                               "peer-000000005.to-1"]
    launch(d, shm, "resume", "n0,n0,n1,n1", "same")
    shutil.rmtree(node_dirs(shm)["n1"])  # node n1 lost, with its memory
    launch(d, shm, "resume", "n0,n0,n2,n2", "peer")
    shutil.rmtree(shm)  # every node's memory lost (a requeue elsewhere)
    launch(d, shm, "resume", "n0,n0,n1,n1", "disk")
    return d


@pytest.mark.parametrize(("case", "step", "tier"), [("same", 5, "memory"), ("peer", 5, "peer"), ("disk", 2, "disk")])
def test_resume_takes_the_newest_complete_copy_and_says_where_from(root: Path, case: str, step: int, tier: str) -> None:
    info = json.loads((root / f"resumed-{case}.json").read_text())
    assert info == {"step": step, "tier": tier}
    if step == 5:  # bit-identical to the state that was saved
        same(torch.load(root / "trained.pt", weights_only=False), torch.load(root / f"resumed-{case}.pt", weights_only=False))


def lose_n1(tmp_path: Path, mode: str) -> tuple[Path, dict[str, Path], list[str]]:
    """Run ckpt_memory.py ``mode`` (n1 lost during step 5's peer copy): the shared memory, its node folders, and
    what n0 holds."""
    shm = tmp_path / "shm"
    cp = subprocess.run([PYTHON, "-m", "torchhpc", "run", "-n", "4", "--env", f"TORCHHPC_SHM_DIR={shm}",
                         "--env", "SLURM_JOB_ID=77", SCRIPT, str(tmp_path), mode, "n0,n0,n1,n1"],
                        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert cp.returncode != 0, cp.stdout + cp.stderr
    nodes = node_dirs(shm)
    return shm, nodes, sorted(p.name for p in nodes["n0"].iterdir() if not p.name.startswith("."))


def test_a_node_lost_during_the_peer_copy_leaves_the_step_before_whole(tmp_path: Path) -> None:
    """Node n1 is lost as the peer copy of step 5 starts: n0 has its own step 5, and of n1's ranks only the
    copies of step 4. n0 keeps its own step 4 until every peer copy of step 5 is complete, so the resume on n0
    and a new node takes step 4 from memory (n1's part from n0's copy), bit-identical, not step 2 from disk."""
    shm, nodes, held = lose_n1(tmp_path, "lose")
    assert held == ["ckpt-000000004", "ckpt-000000005", "peer-000000004.to-0", "peer-000000004.to-1"], held
    shutil.rmtree(nodes["n1"])  # lost with its memory
    launch(tmp_path, shm, "resume", "n0,n0,n2,n2", "lost")
    assert json.loads((tmp_path / "resumed-lost.json").read_text()) == {"step": 4, "tier": "peer"}
    same(torch.load(tmp_path / "trained-4.pt", weights_only=False), torch.load(tmp_path / "resumed-lost.pt", weights_only=False))


def test_a_node_lost_with_half_its_peer_copies_done_leaves_the_step_before_whole(tmp_path: Path) -> None:
    """Run 35: node n1 is lost once rank 2's peer copy of step 5 has reached n0 but rank 3's has not. Rank 0's
    receive was complete, and it dropped its copy of rank 2's step 4 at once: step 5 lacked rank 3's part, step 4
    rank 2's, and the resume went back to disk. Older peer copies now go only once every peer copy of the step
    is complete (as the node's own older checkpoint does), so step 4 is whole from memory, bit-identical."""
    shm, nodes, held = lose_n1(tmp_path, "lose-half")
    assert "peer-000000005.to-0" in held and "peer-000000005.to-1" not in held, held  # the half that arrived
    assert {"ckpt-000000004", "peer-000000004.to-0", "peer-000000004.to-1"} <= set(held), held
    shutil.rmtree(nodes["n1"])  # lost with its memory
    launch(tmp_path, shm, "resume", "n0,n0,n2,n2", "half")
    assert json.loads((tmp_path / "resumed-half.json").read_text()) == {"step": 4, "tier": "peer"}
    same(torch.load(tmp_path / "trained-4.pt", weights_only=False), torch.load(tmp_path / "resumed-half.pt", weights_only=False))


def test_a_local_jobs_memory_is_on_disk_and_freed_when_it_ends(tmp_path: Path) -> None:
    """At the end of a local run its newest memory checkpoint is written to disk (jobdir/shm.persist), then
    its memory tier is removed: nothing left in /dev/shm, and the next run resumes the memory's step from disk,
    bit-identical. Saves to memory at steps 1-3 and to disk at step 1 only."""
    shm = tmp_path / "shm"
    prog = tmp_path / "save.py"
    prog.write_text(
        "import sys, glob, os, torch, torchhpc.dist as thd\nfrom torchhpc.dist import checkpoint\nthd.init()\n"
        "torch.manual_seed(0)\nm = torch.nn.Linear(2, 2)\n"
        "if sys.argv[1] == 'train':\n"
        "    for step in (1, 2, 3):\n"
        "        with torch.no_grad(): m.weight.add_(step)\n"
        "        checkpoint.save('ck', step=step, model=m, tier='memory')\n"
        "        if step == 1: checkpoint.save('ck', step=step, model=m)\n"
        "    print('HELD', len(glob.glob(os.environ['TORCHHPC_SHM_DIR'] + '/torchhpc-local-*')))\n"
        "else:\n"
        "    got = checkpoint.resume('ck', model=m)\n"
        "    print('RESUMED', got['step'], got['tier'])\n"
        "print('WEIGHT', m.weight.sum().item())\n")
    runs = [subprocess.run([PYTHON, "-m", "torchhpc", "run", "-n", "2", "--env", f"TORCHHPC_SHM_DIR={shm}", str(prog),
                            what], cwd=tmp_path, capture_output=True, text=True, timeout=300) for what in ("train", "resume")]
    train, resume = runs
    assert train.returncode == 0 and "HELD 1" in train.stdout, train.stdout + train.stderr
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["ckpt-000000001", "ckpt-000000003"]
    assert resume.returncode == 0 and "RESUMED 3 disk" in resume.stdout, resume.stdout + resume.stderr
    weight = set(re.findall(r"WEIGHT (\S+)", train.stdout))
    assert len(weight) == 1 and weight == set(re.findall(r"WEIGHT (\S+)", resume.stdout)), train.stdout + resume.stdout
    assert not list(shm.glob("torchhpc-*")), list(shm.iterdir())


SAVE_EVERY_STEP = """\
import sys, torch, torchhpc.dist as thd
from torchhpc.dist import checkpoint
thd.init()
torch.manual_seed(0)
m = torch.nn.Linear(2, 2)
for step in (1, 2, 3):
    with torch.no_grad():
        m.weight.add_(step)
    checkpoint.save(sys.argv[1], step=step, model=m, tier="memory")
    if step == 1:
        checkpoint.save(sys.argv[1], step=step, model=m)
"""


@pytest.mark.cluster("slurm")
def test_the_supervisor_writes_the_memory_tier_to_disk_at_the_end(slurm_cluster: Any, slurm: Any, tmp_path: Path) -> None:
    """2 nodes of the dev cluster under the in-allocation supervisor (--max-restarts): memory saves at steps 1-3,
    a disk save at 1; when the job ends the supervisor writes step 3 to disk from the nodes' memory (each node
    its part, run on every node), then frees every node's memory."""
    from tests.integration.test_resilience import run_plain

    shm, ck, prog = tmp_path / "shm", tmp_path / "ck", tmp_path / "save.py"
    prog.write_text(SAVE_EVERY_STEP)
    job = run_plain(slurm_cluster, tmp_path / "out", "memtier", ["-N", "2", "--nproc-per-node", "1", "--max-restarts",
                                                                 "1", "--env", f"TORCHHPC_SHM_DIR={shm}"], [str(prog), str(ck)])
    info = slurm.wait(job, timeout=300)
    log = "\n".join(p.read_text(errors="replace") for p in (tmp_path / "out").rglob("*.out"))
    assert info["JobState"] == "COMPLETED", log
    assert sorted(p.name for p in ck.iterdir()) == ["ckpt-000000001", "ckpt-000000003"], log
    assert f"the memory tier's newest checkpoint is on disk: {ck / 'ckpt-000000003'}" in log, log
    assert not list(shm.glob("torchhpc-*")), list(shm.rglob("*"))
