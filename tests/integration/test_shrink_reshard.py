"""Issue 67: an FSDP2 checkpoint with its data position, saved by 3 nodes x 2 ranks, resumed by 2 x 2 (a node
lost, no spare) and by 4 x 2 (a requeue brought more back): the full tensors and the optimizer state are
identical, and the data goes on from the job's place, dealt to the new world's ranks.

Real ranks under ``torchhpc run`` (local, gloo on CPU; the node count changes only how many ranks there are):
``scripts/ckpt_shrink.py`` saves after a global step of 48 samples (half an epoch of 96) and rank 0 dumps the
full state; each resume dumps it again as restored, and every rank writes its next batch.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import PYTHON, REPO, need

torch = need("torch")
pytestmark = pytest.mark.slow

SCRIPT = str(REPO / "tests" / "integration" / "scripts" / "ckpt_shrink.py")


def launch(world: int, root: Path, *args: str) -> None:
    cp = subprocess.run([PYTHON, "-m", "torchhpc", "run", "-n", str(world), SCRIPT, str(root), *args],
                        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert cp.returncode == 0 and "DONE" in cp.stdout, cp.stdout + cp.stderr


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("shrink")
    launch(6, d, "train")
    launch(4, d, "resume")
    launch(8, d, "resume")
    return d


def same(a: Any, b: Any, where: str = "") -> None:
    if isinstance(a, dict):
        assert set(a) == set(b), where
        for k in a:
            same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    else:
        assert a == b, where


@pytest.mark.parametrize("world", [4, 8])
def test_full_model_and_optimizer_state_are_identical(root: Path, world: int) -> None:
    saved = torch.load(root / "saved.pt", weights_only=False)
    resumed = torch.load(root / f"resumed-{world}.pt", weights_only=False)
    same(saved, resumed)


@pytest.mark.parametrize("world", [4, 8])
def test_the_data_goes_on_from_the_jobs_place_on_the_new_world(root: Path, world: int) -> None:
    position = json.loads((root / "position.json").read_text())
    assert position == {"epoch": 0, "consumed": 48}  # one global step of 48: 6 ranks x 4 micro-batches of 2
    order = torch.randperm(96, generator=torch.Generator().manual_seed(3)).tolist()
    rest = order[48:]
    per_rank = [json.loads((root / f"next-{world}-{r}.json").read_text()) for r in range(world)]
    for r, got in enumerate(per_rank):
        assert got["next"] == rest[r::world][:2], (r, got)
        assert got["accumulation"] == 48 // (2 * world)  # the same global batch on the new world
    handed = [i for got in per_rank for i in got["next"]]
    assert sorted(handed) == sorted(rest[: 2 * world])  # the next step takes the next samples, none seen before
