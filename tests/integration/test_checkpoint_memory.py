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
import shutil
import subprocess
from pathlib import Path

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
    return {d.name: d for d in shm.glob("torchhpc-77-*/*")}


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


def test_a_local_jobs_memory_is_freed_when_it_ends(tmp_path: Path) -> None:
    """The local scheduler removes its run's memory tier at the end (jobdir/shm.py): nothing left in /dev/shm."""
    shm = tmp_path / "shm"
    prog = tmp_path / "save.py"
    prog.write_text("import torch, torchhpc.dist as thd\nfrom torchhpc.dist import checkpoint\nthd.init()\n"
                    "m = torch.nn.Linear(2, 2)\ncheckpoint.save('ck', step=1, model=m, tier='memory')\n"
                    "import os, glob\nprint('HELD', len(glob.glob(os.environ['TORCHHPC_SHM_DIR'] + '/torchhpc-local-*')))\n")
    cp = subprocess.run([PYTHON, "-m", "torchhpc", "run", "-n", "2", "--env", f"TORCHHPC_SHM_DIR={shm}", str(prog)],
                        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert cp.returncode == 0 and "HELD 1" in cp.stdout, cp.stdout + cp.stderr
    assert not list(shm.glob("torchhpc-*")), list(shm.iterdir())
