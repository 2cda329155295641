"""torchhpc.dist.checkpoint with real ranks: DDP and FSDP2 on CPU/gloo, resharding, old files, random kills.

``scripts/ckpt_dcp.py`` trains four models under ``torchhpc run`` (local scheduler):
DDP and FSDP2 (``fully_shard``), each saved blocking and asynchronously at step 3,
then on to step 5; a second launch resumes each from step 3 and goes on to step 5.
Rank 0 dumps the full (unsharded) parameters, optimizer state and RNG state at both
steps, so runs compare bit for bit with ``torch.equal``, and a run saved by 4 ranks
compares with one resumed by 2 or 3 (resharding). Six launches in all, shared by the
tests through a module-scoped cache.

``scripts/ckpt_crash.py`` forks the ranks of an FSDP2 run that saves asynchronously
every step and SIGKILLs all of them at 20 random moments (a fork per round, not a
launch: about half a minute here).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import PYTHON, REPO, load_file, need

torch = need("torch")
pytestmark = pytest.mark.slow

SCRIPTS = REPO / "tests" / "integration" / "scripts"
TRAIN = str(SCRIPTS / "ckpt_dcp.py")
CRASH = str(SCRIPTS / "ckpt_crash.py")
KINDS = ("ddp-sync", "ddp-async", "fsdp-sync", "fsdp-async")


def launch(world: int, root: Path, *args: str) -> str:
    cp = subprocess.run([PYTHON, "-m", "torchhpc", "run", "-n", str(world), TRAIN, str(root), *args],
                        cwd=REPO, capture_output=True, text=True, timeout=300)
    out = cp.stdout + cp.stderr
    assert cp.returncode == 0 and "DONE" in cp.stdout, out
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every launch of the module, once: train by 4 and by 2; resume by 4 and 2 (same world), by 2 and 3 (from 4)."""
    roots = {name: tmp_path_factory.mktemp(name) for name in ("w4", "w2", "w4-again", "w2-again", "w4-to-2", "w4-to-3")}
    launch(4, roots["w4"], "train")
    launch(2, roots["w2"], "train", "--legacy")
    launch(4, roots["w4-again"], "resume", "--from", str(roots["w4"]))
    launch(2, roots["w2-again"], "resume", "--from", str(roots["w2"]),
           "--kinds", ",".join([*KINDS, "ddp-sync:legacy", "fsdp-sync:legacy"]))
    launch(2, roots["w4-to-2"], "resume", "--from", str(roots["w4"]))
    launch(3, roots["w4-to-3"], "resume", "--from", str(roots["w4"]))
    return roots


# benchmarks/gpu_checkpoint.py's comparison (the same runs on a GPU), loaded from its file
differences = load_file(REPO / "benchmarks" / "gpu_checkpoint.py").differences


def same(a: Any, b: Any, where: str = "") -> None:
    """Bit for bit: tensors by torch.equal (dtype and shape too), containers recursively."""
    diff = differences(a, b, where)
    assert not diff, f"differs at {', '.join(diff[:5])}"


def dumped(root: Path, name: str) -> dict[str, Any]:
    d: dict[str, Any] = torch.load(root / name, weights_only=False)
    assert d["model"] and d["optim"]["state"], name  # something to compare: parameters and Adam's moments
    return d


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("kind", KINDS)
def test_resumed_run_is_bit_identical_to_the_uninterrupted_one(runs: dict[str, Path], world: int, kind: str) -> None:
    """Saved at step 3 (blocking or not) and went on to 5, against resumed from 3 and on to 5."""
    trained, resumed = runs[f"w{world}"], runs[f"w{world}-again"]
    same(dumped(trained, f"{kind}.train.3.pt"), dumped(resumed, f"{kind}.resume.3.pt"), f"{kind} at the save")
    same(dumped(trained, f"{kind}.train.5.pt"), dumped(resumed, f"{kind}.resume.5.pt"), f"{kind} at the end")
    assert not torch.equal(dumped(trained, f"{kind}.train.3.pt")["model"]["0.weight"],
                           dumped(trained, f"{kind}.train.5.pt")["model"]["0.weight"])  # it did train on


@pytest.mark.parametrize("to", [2, 3])
@pytest.mark.parametrize("kind", KINDS)
def test_saved_by_four_resumed_by_fewer_gives_the_same_full_tensors(runs: dict[str, Path], to: int, kind: str) -> None:
    same(dumped(runs["w4"], f"{kind}.train.3.pt"), dumped(runs[f"w4-to-{to}"], f"{kind}.resume.3.pt"), kind)
    if kind.startswith("fsdp"):  # the shards really were cut for 4: rank 3 held a part of the first layer
        assert (runs["w4"] / kind / "ckpt-000000003" / "__3_0.distcp").is_file()


@pytest.mark.parametrize("into", ["ddp-sync", "fsdp-sync"])
def test_an_old_single_file_checkpoint_resumes_into_ddp_and_fsdp(runs: dict[str, Path], into: str) -> None:
    """The old helper's file (rank 0's torch.save of the DDP model) loads into DDP and into FSDP2 shards."""
    w2, again = runs["w2"], runs["w2-again"]
    assert (w2 / "legacy" / "ckpt-000000003.pt").is_file()
    same(dumped(w2, "ddp-sync.train.3.pt"), dumped(again, f"{into}-legacy.resume.3.pt"), into)
    if into == "ddp-sync":  # and it trains on exactly as the uninterrupted DDP run did
        same(dumped(w2, "ddp-sync.train.5.pt"), dumped(again, "ddp-sync-legacy.resume.5.pt"), into)


def test_sigkill_of_every_rank_at_20_random_moments(tmp_path: Path) -> None:
    """Each resume lands on the newest complete checkpoint, never loses a completed one, and every state
    it resumes and every step after it matches the uninterrupted run bit for bit."""
    rounds = killed_and_resumed(tmp_path, 20, 52)
    training = [r for r in rounds if r["phase"] == "training"]
    assert sum(1 for r in training if r["torn"]) >= 3, rounds  # some kills caught a save half written


def test_memory_tier_survives_10_kills_and_ends_on_disk_with_memory_freed(tmp_path: Path) -> None:
    """Issue 68: the same with a memory save every step (each rank a node, so each save also makes a peer copy):
    each resume lands on the newest step the nodes' memory holds whole, bit for bit; at the job's end the
    newest memory step is on disk and no shared memory is left."""
    killed_and_resumed(tmp_path, 10, 68, "--tier", "memory")
    report = json.loads((tmp_path / "report.json").read_text())
    assert checkpoint_step(tmp_path / "ckpt") == report["reached"]
    assert not list((tmp_path / "shm").glob("torchhpc-*")), list((tmp_path / "shm").rglob("*"))[:10]


def checkpoint_step(where: Path) -> int:
    from torchhpc.dist.checkpoint import latest

    found = latest(where)
    return int(found.name.split("-")[1]) if found else 0


def killed_and_resumed(tmp_path: Path, n: int, seed: int, *extra: str) -> list[dict[str, Any]]:
    """Run the kill harness (tests/integration/scripts/ckpt_crash.py) for ``n`` rounds and check every resume."""
    cp = subprocess.run([PYTHON, CRASH, str(tmp_path), "--world", "2", "--rounds", str(n), "--seed", str(seed), *extra],
                        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    reference = {int(k): v for k, v in report["reference"].items()}
    rounds: list[dict[str, Any]] = report["rounds"]
    log = [line.split() for line in (tmp_path / "log").read_text().splitlines()]
    resumed = {int(x[1]): (int(x[2]), x[3]) for x in log if x[0] == "R" and len(x) >= 4}
    steps = [(int(x[2]), x[3]) for x in log if x[0] == "S" and len(x) >= 4]

    assert len(rounds) == n, rounds
    for r in rounds:  # every rank died by the kill, none of anything before it
        assert r["exit_codes"] == [-9, -9], (r, cp.stderr[-3000:])
    for r in rounds:
        if r["published"] is not None:  # a save the run saw complete is never lost
            assert r["latest"] >= r["published"], r
    before = 0
    for k in range(n + 1):  # round n ran to its end
        if k in resumed:
            step, digest = resumed[k]
            assert step == before, f"round {k} resumed step {step}, the newest complete checkpoint was {before}"
            assert digest == reference[step], f"round {k}: the state at step {step} differs from the uninterrupted run"
        if k < n:
            assert rounds[k]["latest"] >= before, rounds[k]  # checkpoints only move forward
            before = rounds[k]["latest"]
    for step, digest in steps:
        assert digest == reference[step], f"step {step} differs from the uninterrupted run"
    assert resumed[n][0] == rounds[-1]["latest"] and report["reached"] == rounds[-1]["latest"] + 5
    training = [r for r in rounds if r["phase"] == "training"]
    assert len(training) == n - n // 5 and all(r["round"] in resumed for r in training)  # killed after they resumed
    return rounds
