"""Failure verdicts for real faults planted in 2-node x 2-rank jobs on the dev cluster, and locally.

Nothing is faked: the ranks really raise or abort under srun, torchrun and mpirun, and the verdict
comes from the per-rank files, the launchers' messages and Slurm's accounting, as a user sees it at
the end of `run --wait` and from `torchhpc diagnose`.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.cli_run import torchhpc
from tests.conftest import REPO, hang_timeout, left_running

FAULT = str(REPO / "tests" / "integration" / "scripts" / "planted_fault.py")


def host_of(tmp_path: Path, rank: int) -> str:
    """The node a rank ran on, from its own log file's name (ranks/rank-N@NODE.log)."""
    found = list(tmp_path.glob(f"*/ranks/rank-{rank}@*.log"))
    assert len(found) == 1, found
    return found[0].name.split("@", 1)[1][: -len(".log")]


def _run(cluster: Any, launcher: str, tmp_path: Path, *fault: str) -> tuple[subprocess.CompletedProcess[str], str]:
    r = torchhpc(
        cluster.client_env(), "run", "--scheduler", "slurm", "--nodes", "2", "--nproc-per-node", "2",
        "--launcher", launcher, "--output-dir", str(tmp_path), "--name", f"fault-{launcher}", FAULT, *fault,
        "--wait", cwd=tmp_path,
    )
    m = re.search(r"Submitted slurm:(\d+)", r.stdout)
    assert m, r.stdout + r.stderr
    return r, m.group(1)


@pytest.mark.cluster("slurm")
@pytest.mark.parametrize("launcher", ["torchrun", "srun", "mpirun"])
def test_exception_on_rank_2_is_named_first(slurm_cluster: Any, launcher: str, tmp_path: Path) -> None:
    r, job = _run(slurm_cluster, launcher, tmp_path, "raise", "2")
    assert r.returncode != 0
    tail = r.stderr.splitlines()[-8:]  # the verdict is the last thing printed, 8 lines at most
    text = "\n".join(tail)
    host = host_of(tmp_path, 2)
    assert "user-exception" in text and f"first failed: rank 2 on {host}" in text, r.stderr
    assert "ValueError: planted failure on rank 2" in text and "planted_fault.py:" in text
    assert "ranks 0-1,3" in text
    d = torchhpc(slurm_cluster.client_env(), "diagnose", f"slurm:{job}", "--json", cwd=tmp_path)
    assert d.returncode == 1, d.stderr
    v = json.loads(d.stdout)
    assert v["class"] == "user-exception" and v["first"]["rank"] == 2 and v["first"]["host"] == host
    assert v["consequences"] == [0, 1, 3]


@pytest.mark.cluster("slurm")
@pytest.mark.parametrize("launcher", ["torchrun", "srun", "mpirun"])
def test_abort_is_named_with_sigabrt_not_the_launchers_code(slurm_cluster: Any, launcher: str, tmp_path: Path) -> None:
    r, _job = _run(slurm_cluster, launcher, tmp_path, "abort", "3")
    assert r.returncode != 0
    text = "\n".join(r.stderr.splitlines()[-8:])
    assert "native-crash" in text and f"first failed: rank 3 on {host_of(tmp_path, 3)}, SIGABRT" in text, r.stderr


@pytest.mark.cluster("slurm")
def test_time_limit_is_the_verdict(slurm_cluster: Any, tmp_path: Path) -> None:
    prog = "import time\nfor i in range(600):\n    print('step', i, flush=True); time.sleep(1)\n"
    r = torchhpc(
        slurm_cluster.client_env(), "run", "--scheduler", "slurm", "--nodes", "1", "--nproc-per-node", "1",
        "--launcher", "srun", "--time", "00:01:00", "--output-dir", str(tmp_path), "--name", "too-long",
        "--wait", "--", sys.executable, "-c", prog, cwd=tmp_path, timeout=400,
    )
    assert r.returncode != 0
    assert "diagnosis: time-limit" in "\n".join(r.stderr.splitlines()[-8:]), r.stderr


def test_local_scheduler_gives_the_same_verdict(clean_user_env: None, tmp_path: Path) -> None:
    import os

    env = dict(os.environ)
    sub = torchhpc(env, "run", "-n", "4", "--background", FAULT, "raise", "2", cwd=tmp_path)
    m = re.search(r"Submitted (local:\S+)", sub.stdout)
    assert m, sub.stdout + sub.stderr
    w = torchhpc(env, "wait", m.group(1), cwd=tmp_path)
    assert w.returncode != 0
    text = "\n".join(w.stderr.splitlines()[-8:])
    assert "user-exception" in text and "first failed: rank 2" in text and "ValueError: planted failure" in text, w.stderr


HANG = str(REPO / "tests" / "integration" / "scripts" / "planted_hang.py")


def _hang_line() -> int:
    return next(i for i, t in enumerate(Path(HANG).read_text().splitlines(), 1) if "time.sleep(3600)" in t)


def _assert_hang_named(out: str, host: str) -> None:
    assert f"torchhpc: hang: rank 3 on {host} is not in a collective" in out, out
    assert f"planted_hang.py:{_hang_line()}" in out, out
    assert "wait in all_reduce" in out, out
    assert "diagnosis: hang" in out and "culprit: rank 3" in out, out
    # the Flight Recorder's line leads: the collective rank 3 never entered, with its user frame
    assert "rank 3 never entered all_reduce #1 (pg 0); ranks 0-2 have waited in it" in out, out


PLANTED = str(REPO / "tests" / "integration" / "scripts" / "planted_collective.py")


@pytest.mark.cluster("slurm")
@pytest.mark.parametrize(
    ("launcher", "case", "verdict"),
    [
        ("torchrun", "gather", "collective-mismatch — collective mismatch at #4 (pg 0): ranks 0-2 called all_reduce, rank 3 all_gather"),
        ("srun", "skip", "hang — rank 3 never entered all_reduce #5 (pg 0); ranks 0-2 have waited in it for"),
        ("mpirun", "size", "collective-mismatch — size mismatch in all_reduce #4 (pg 0): ranks 0-2 passed [[4]], rank 3 passed [[8]]"),
        ("srun", "exit", "lost-peer — rank 3 left the group (exited without destroy_process_group) before all_reduce #4"),
    ],
)
def test_a_planted_collective_fault_is_named_from_the_flight_recorder(
    slurm_cluster: Any, launcher: str, case: str, verdict: str, tmp_path: Path
) -> None:
    """Rank 3 breaks the collective sequence (tests/integration/scripts/planted_collective.py): the
    verdict names the collective it missed or the call that differs, from every rank's dump in fr/."""
    r = torchhpc(
        slurm_cluster.client_env(), "run", "--scheduler", "slurm", "--nodes", "2", "--nproc-per-node", "2",
        "--launcher", launcher, "--output-dir", str(tmp_path), "--name", f"fr-{case}", "--hang-timeout", hang_timeout(20),
        PLANTED, case, "3", "--wait", cwd=tmp_path, timeout=400,
    )
    assert r.returncode != 0
    assert f"diagnosis: {verdict}" in r.stderr, r.stderr
    job = re.search(r"Submitted slurm:(\d+)", r.stdout).group(1)  # type: ignore[union-attr]
    dumps = sorted(p.name for p in (tmp_path / f"fr-{case}-{job}" / "fr").glob("rank-*"))
    answered = {n.removesuffix(".left") for n in dumps}
    if case == "exit":  # rank 3 left; the others leave as srun kills the step, and on a loaded machine one of them
        # may be SIGKILLed before its exit dump (run F: ranks 0, 2 and 3): the leaver's, from both nodes
        assert "rank-3.left" in dumps and {"rank-0", "rank-1"} & answered and "rank-2" in answered, dumps
    else:  # every rank answered the request, on both nodes, into the job directory; a rank the cancel found with
        # its group still up may also write its exit dump, rank-N.left (on a loaded machine it has time to)
        assert answered == {f"rank-{r}" for r in range(4)}, dumps


@pytest.mark.cluster("slurm")
@pytest.mark.parametrize("launcher", ["torchrun", "srun", "mpirun"])
def test_planted_hang_is_named_and_cancelled(slurm_cluster: Any, launcher: str, tmp_path: Path) -> None:
    """Rank 3 sleeps before an all_reduce: within 90 s of the hang the job is named, stacked and cancelled."""
    import time

    t0 = time.monotonic()
    r = torchhpc(
        slurm_cluster.client_env(), "run", "--scheduler", "slurm", "--nodes", "2", "--nproc-per-node", "2",
        "--launcher", launcher, "--output-dir", str(tmp_path), "--name", f"hang-{launcher}", "--hang-timeout", hang_timeout(20),
        HANG, "3", "--wait", cwd=tmp_path, timeout=400,
    )
    assert r.returncode != 0
    _assert_hang_named(r.stderr, host_of(tmp_path, 3))
    assert time.monotonic() - t0 < 240  # queue + start + 20 s quiet + probe; far from the 3600 s sleep
    job = re.search(r"Submitted slurm:(\d+)", r.stdout).group(1)  # type: ignore[union-attr]
    assert (tmp_path / f"hang-{launcher}-{job}" / "hang.json").is_file()
    # nothing left running: no process of the job on any node
    assert left_running(HANG, tmp_path) == []


def test_planted_hang_local(clean_user_env: None, tmp_path: Path) -> None:
    import os

    env = dict(os.environ)
    sub = torchhpc(env, "run", "-n", "4", "--background", HANG, "3", cwd=tmp_path)
    handle = re.search(r"Submitted (local:\S+)", sub.stdout).group(1)  # type: ignore[union-attr]
    w = torchhpc(env, "wait", handle, "--hang-timeout", hang_timeout(10), cwd=tmp_path, timeout=200)
    assert w.returncode != 0
    _assert_hang_named(w.stderr, "localhost")
