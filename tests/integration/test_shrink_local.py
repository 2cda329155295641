"""Issue 67, on this machine: ``examples/elastic_ddp.py`` loses its third rank's share and goes on with two.

Real ranks under ``torchhpc run`` (gloo, CPU): an uninterrupted run on 3 ranks; a run on 3 ranks that
checkpoints every 10 steps and is "lost" after step 25 (its last 5 steps are lost with it); the same job
resumed from step 20 on 2 ranks, as the supervisor's next attempt after a shrink would be
(``TORCHHPC_RESTART_COUNT=1``). The global batch is the same on both worlds (48 samples: 8 micro-batches a
rank on 3, 12 on 2). The node loss and the supervisor's shrink on a real cluster are
tests/integration/test_resilience.py's shrink scenarios; here the program's half of the contract is checked alone.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import PYTHON, REPO, need

torch = need("torch")
pytestmark = pytest.mark.slow

EXAMPLE = str(REPO / "examples" / "elastic_ddp.py")


def run(world: int, cwd: Path, *args: str, restart: int = 0) -> dict[str, object]:
    cp = subprocess.run([PYTHON, "-m", "torchhpc", "run", "-n", str(world), "--env", f"TORCHHPC_RESTART_COUNT={restart}",
                         "--env", f"TORCHHPC_DATA_LEDGER={cwd / 'ledger'}", EXAMPLE, *args],
                        cwd=cwd, capture_output=True, text=True, timeout=300)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    line = next(ln for ln in cp.stdout.splitlines() if "RESULT " in ln)
    return dict(json.loads(line.split("RESULT ", 1)[1]))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    whole, shrunk = tmp_path_factory.mktemp("whole"), tmp_path_factory.mktemp("shrunk")
    out = {"whole": run(3, whole, "--steps", "40", "--ckpt", "ckpt", "--samples", "480")}
    run(3, shrunk, "--steps", "25", "--ckpt", "ckpt", "--samples", "480")  # 21-25 lost: no checkpoint after 20
    out["shrunk"] = run(2, shrunk, "--steps", "40", "--ckpt", "ckpt", "--samples", "480", restart=1)
    out["ledger"] = str(shrunk / "ledger")
    return out


def test_the_shrunk_run_ends_where_the_uninterrupted_one_does(runs: dict[str, object]) -> None:
    whole, shrunk = runs["whole"], runs["shrunk"]
    assert isinstance(whole, dict) and isinstance(shrunk, dict)
    assert (whole["world"], shrunk["world"]) == (3, 2)
    assert abs(float(shrunk["loss"]) - float(whole["loss"])) <= 1e-5 * abs(float(whole["loss"])), (whole, shrunk)


def test_every_sample_of_every_epoch_is_consumed_once(runs: dict[str, object]) -> None:
    from torchhpc.dist import read_ledger

    consumed = read_ledger(str(runs["ledger"]))
    # 40 steps of 48 samples over epochs of 480: 4 whole epochs
    assert sorted(consumed) == [0, 1, 2, 3], sorted(consumed)
    for epoch, counts in consumed.items():
        assert set(counts) == set(range(480)) and set(counts.values()) == {1}, epoch
