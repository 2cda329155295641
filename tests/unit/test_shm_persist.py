"""jobdir/shm.persist: the newest memory-tier checkpoint written to disk at the job's end, from the parts the
nodes left hold (their own and their peer copies). The layout is the one torchhpc.dist.memtier writes (its
names imported, not copied); the files' contents are stand-ins here, the real DCP files are persisted and
resumed in tests/integration/test_checkpoint_memory.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from torchhpc.dist.memtier import DCP_META, META
from torchhpc.jobdir.shm import DIR_FILE, FILES, free, persist

ALL = ["__0_0.distcp", "__1_0.distcp", "__2_0.distcp", "__3_0.distcp", DCP_META, META, FILES]


def tier(shm: Path, disk: Path, job: str = "77") -> Path:
    t = shm / f"torchhpc-{job}-0123456789"
    t.mkdir(parents=True)
    (t / DIR_FILE).write_text(str(disk))
    return t


def ckpt(d: Path, names: list[str], listing: bool = True) -> None:
    d.mkdir(parents=True)
    for n in names:
        (d / n).write_text(f"{d.name}:{n}" if n != FILES else json.dumps(ALL))
    if listing and FILES not in names:
        (d / FILES).write_text(json.dumps(ALL))


def test_a_lost_nodes_ranks_come_from_the_peer_copies(tmp_path: Path) -> None:
    """Node n1 (ranks 2, 3) is gone with its memory; n0 kept their copies: step 5 lands on disk whole."""
    disk = tmp_path / "ck"
    t = tier(tmp_path / "shm", disk)
    ckpt(t / "n0" / "ckpt-000000005", ["__0_0.distcp", "__1_0.distcp", DCP_META, META])
    ckpt(t / "n0" / "peer-000000005.to-0", ["__2_0.distcp", DCP_META, META])
    ckpt(t / "n0" / "peer-000000005.to-1", ["__3_0.distcp", DCP_META, META])
    (disk / "ckpt-000000002").mkdir(parents=True)
    assert persist("77", str(tmp_path / "shm")) == [str(disk / "ckpt-000000005")]
    assert sorted(p.name for p in (disk / "ckpt-000000005").iterdir()) == sorted(ALL)
    assert (disk / "ckpt-000000005" / "__2_0.distcp").read_text() == "peer-000000005.to-0:__2_0.distcp"
    assert not list(disk.glob(".*")), list(disk.iterdir())  # no stage left
    assert persist("77", str(tmp_path / "shm")) == []  # already on disk: nothing to do


def test_a_step_with_a_part_lost_everywhere_is_not_written_the_one_before_is(tmp_path: Path) -> None:
    disk = tmp_path / "ck"
    t = tier(tmp_path / "shm", disk)
    ckpt(t / "n0" / "ckpt-000000006", ["__0_0.distcp", "__1_0.distcp", DCP_META, META])  # n1's part of 6: lost
    ckpt(t / "n0" / "peer-000000005.to-0", ["__2_0.distcp", "__3_0.distcp", DCP_META, META])
    ckpt(t / "n2" / "ckpt-000000005", ["__0_0.distcp", "__1_0.distcp", DCP_META, META])
    assert persist("77", str(tmp_path / "shm")) == [str(disk / "ckpt-000000005")]
    assert not (disk / "ckpt-000000006").exists()
    # step 6's stage waits for a node that may hold the rest; named so the next disk save clears it
    assert sorted(p.name for p in disk.iterdir()) == [".ckpt-000000006.persist.tmp", "ckpt-000000005"]


def test_nothing_newer_than_the_disk_and_other_jobs_are_left_alone(tmp_path: Path) -> None:
    disk = tmp_path / "ck"
    t = tier(tmp_path / "shm", disk)
    ckpt(t / "n0" / "ckpt-000000004", ALL[:-1])
    (disk / "ckpt-000000004").mkdir(parents=True)
    other = tier(tmp_path / "shm", tmp_path / "other", job="78")
    ckpt(other / "n0" / "ckpt-000000009", ALL[:-1])
    assert persist("77", str(tmp_path / "shm")) == []
    assert list((disk / "ckpt-000000004").iterdir()) == [] and not (tmp_path / "other").exists()


def test_the_supervisors_command_persists_then_frees(tmp_path: Path) -> None:
    """What the supervisor runs on each node (stdlib only): ``--persist JOB`` says what it wrote; ``JOB`` frees."""
    disk, shm = tmp_path / "ck", tmp_path / "shm"
    ckpt(tier(shm, disk) / "n0" / "ckpt-000000003", ALL[:-1])
    env = {"TORCHHPC_SHM_DIR": str(shm), "PATH": "/usr/bin:/bin"}
    code = ("import runpy, sys; sys.argv = ['shm', '--persist', '77']; "
            "runpy.run_module('torchhpc.jobdir.shm', run_name='__main__'); print('torch' in sys.modules)")
    cp = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                        cwd=Path(__file__).parents[2] / "src")
    assert cp.returncode == 0 and cp.stdout.splitlines() == [
        f"torchhpc: the memory tier's newest checkpoint is on disk: {disk / 'ckpt-000000003'}", "False"], cp.stdout + cp.stderr
    assert free("77", str(shm)) and not list(shm.iterdir())


def test_a_node_that_copies_while_another_publishes_leaves_no_stage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every node persists at once (the supervisor runs it on each): n1 reads the disk, n0 publishes step 3,
    then n1 copies its part. n1 clears the stage it made again; the disk holds the checkpoint and nothing else
    (a CI run left ``.ckpt-000000003.persist.tmp`` beside ``ckpt-000000003`` this way)."""
    import torchhpc.jobdir.shm as shm_mod

    disk = tmp_path / "ck"
    parts = {"n0": ["__0_0.distcp", "__1_0.distcp"], "n1": ["__2_0.distcp", "__3_0.distcp"]}
    for node, other in (("n0", "n1"), ("n1", "n0")):  # each node holds its own part and a copy of the other's
        t = tier(tmp_path / node, disk)
        ckpt(t / node / "ckpt-000000003", [*parts[node], DCP_META, META])
        ckpt(t / node / "peer-000000003.to-0", [*parts[other], DCP_META, META])
    real = shm_mod._persist_step

    def n0_first(directory: Path, step: int, dirs: list[Path]) -> object:
        monkeypatch.setattr(shm_mod, "_persist_step", real)
        assert persist("77", str(tmp_path / "n0")) == [str(disk / "ckpt-000000003")]  # n0 wins meanwhile
        return real(directory, step, dirs)

    monkeypatch.setattr(shm_mod, "_persist_step", n0_first)
    assert persist("77", str(tmp_path / "n1")) == []
    assert sorted(p.name for p in disk.iterdir()) == ["ckpt-000000003"]
    assert sorted(p.name for p in (disk / "ckpt-000000003").iterdir()) == sorted(ALL)
