"""The same planted fault gets the same verdict in a local foreground run, a local background run and a
Slurm job on the dev cluster; a foreground run honours --hang-timeout.

Nothing is faked: the ranks really raise or sleep (real gloo, real processes, real Slurm), and the
verdicts compared are `torchhpc diagnose --json` of each job, read from what each job left on disk.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from tests.cli_run import torchhpc
from tests.conftest import hang_timeout, left_running
from tests.integration.test_diagnose_cluster import FAULT, HANG, _assert_hang_named
from torchhpc.core.exitcodes import EXIT_CODES


def _env() -> dict[str, str]:
    return dict(os.environ)


def _verdict(env: dict[str, str], handle: str, cwd: Path) -> dict[str, Any]:
    d = torchhpc(env, "diagnose", handle, "--json", cwd=cwd)
    assert d.stdout, d.stderr
    v: dict[str, Any] = json.loads(d.stdout)
    return v


def _essence(v: dict[str, Any]) -> tuple[object, ...]:
    """What must agree across paths: class, culprit rank, its error and file:line, the others."""
    first = v.get("first") or {}
    where = os.path.basename(first.get("where", ""))
    return v["class"], first.get("rank"), first.get("error", "").split(" (")[0], where, tuple(v["consequences"])


def _local_handle(stderr: str) -> str:
    """A foreground run's handle, from its verdict's next step (`torchhpc logs local:ID ...`) or hang.json's path."""
    m = re.search(r"local:([0-9a-f]{10})", stderr) or re.search(r"jobs/local/([0-9a-f]{10})/hang\.json", stderr)
    assert m, stderr
    return f"local:{m.group(1)}"


def _background(env: dict[str, str], tmp_path: Path, *argv: str, wait: tuple[str, ...] = ()) -> tuple[str, str]:
    sub = torchhpc(env, "run", "-n", "4", "--background", *argv, cwd=tmp_path)
    m = re.search(r"Submitted (local:\S+)", sub.stdout)
    assert m, sub.stdout + sub.stderr
    w = torchhpc(env, "wait", m.group(1), *wait, cwd=tmp_path, timeout=200)
    assert w.returncode != 0
    return m.group(1), w.stderr


def _slurm(cluster: Any, tmp_path: Path, name: str, *argv: str) -> tuple[str, str]:
    r = torchhpc(
        cluster.client_env(), "run", "--scheduler", "slurm", "--nodes", "2", "--nproc-per-node", "2",
        "--launcher", "srun", "--output-dir", str(tmp_path), "--name", name, *argv, "--wait", cwd=tmp_path, timeout=400,
    )
    assert r.returncode != 0
    m = re.search(r"Submitted (slurm:\d+)", r.stdout)
    assert m, r.stdout + r.stderr
    return m.group(1), r.stderr


def test_foreground_failure_ends_with_the_verdict(clean_user_env: None, tmp_path: Path) -> None:
    """The verdict is the last thing a failed foreground run prints, not "look for its traceback above"."""
    r = torchhpc(_env(), "run", "-n", "4", FAULT, "raise", "2", cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    tail = r.stderr.splitlines()[-8:]
    text = "\n".join(tail)
    assert "Error: rank 2 exited with code 1" in r.stderr
    assert "diagnosis: user-exception" in text and "first failed: rank 2 on localhost, exit 1" in text, r.stderr
    assert "ValueError: planted failure on rank 2" in text and "planted_fault.py:21" in text
    assert "ranks 0-1,3" in text and "look for its traceback" not in r.stderr
    handle = _local_handle(r.stderr)
    # the run is a job like any other afterwards: its record, its log, its verdict
    st = json.loads(torchhpc(_env(), "status", handle, "--json", cwd=tmp_path).stdout)
    assert st["state"] == "FAILED" and st["exit_code"] == 1
    logs = torchhpc(_env(), "logs", handle, "--rank", "2", cwd=tmp_path)
    assert "ValueError: planted failure on rank 2" in logs.stdout


def test_foreground_rank0_only_failure_still_names_the_hidden_rank(clean_user_env: None, tmp_path: Path) -> None:
    r = torchhpc(_env(), "run", "-n", "4", "--rank0-only", FAULT, "raise", "2", cwd=tmp_path)
    assert r.returncode == 1
    text = "\n".join(r.stderr.splitlines()[-8:])
    assert "first failed: rank 2 on localhost" in text and "ValueError: planted failure on rank 2" in text, r.stderr
    assert "[rank1]:" not in r.stdout + r.stderr.replace("[rank2]:", "")  # rank 1's lines stay hidden


def test_foreground_hang_is_named_and_stopped(clean_user_env: None, tmp_path: Path) -> None:
    """`torchhpc run -n 4 --hang-timeout 20 planted_hang.py 3`: named, stacked, stopped (it used to run forever)."""
    quiet = hang_timeout(20)
    r = torchhpc(_env(), "run", "-n", "4", "--hang-timeout", quiet, HANG, "3", cwd=tmp_path, timeout=300)
    assert r.returncode == EXIT_CODES["hang"], r.stderr  # the class's code (81), not the ranks' SIGTERM 143
    _assert_hang_named(r.stderr, "localhost")
    assert f"Error: the hang watch cancelled the run (--hang-timeout {quiet}); stopped 4 running ranks of 4" in r.stderr
    assert "diagnosis: hang" in "\n".join(r.stderr.splitlines()[-8:])
    handle = _local_handle(r.stderr)
    st = json.loads(torchhpc(_env(), "status", handle, "--json", cwd=tmp_path).stdout)
    assert st["state"] == "CANCELLED"
    assert left_running(HANG, tmp_path) == []


def test_on_hang_requeue_is_refused_locally(clean_user_env: None, tmp_path: Path) -> None:
    for args in (["run", "-n", "2", "--hang-timeout", hang_timeout(20), "--on-hang", "requeue", FAULT, "raise", "1"],):
        r = torchhpc(_env(), *args, cwd=tmp_path)
        assert r.returncode == 2 and "cannot requeue" in r.stderr and "HINT:" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr and "[rank" not in r.stdout  # refused before any rank started


def test_background_without_wait_says_where_the_watch_runs(clean_user_env: None, tmp_path: Path) -> None:
    r = torchhpc(_env(), "run", "-n", "1", "--background", "--hang-timeout", "30", "--", "python", "-c", "pass",
                 cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    # the job's own process watches it (supervisor/restarts.py): wait needs no --hang-timeout
    assert "Hang watch: in the job itself (--hang-timeout 30), no client needed" in r.stdout, r.stdout
    assert re.search(r"Follow it with: torchhpc wait local:\S+; ", r.stdout), r.stdout


@pytest.mark.cluster("slurm")
def test_exception_verdict_is_the_same_on_every_path(slurm_cluster: Any, clean_user_env: None, tmp_path: Path) -> None:
    env = _env()
    fg = torchhpc(env, "run", "-n", "4", FAULT, "raise", "2", cwd=tmp_path)
    assert fg.returncode == 1
    fg_v = _verdict(env, _local_handle(fg.stderr), tmp_path)
    bg_handle, _ = _background(env, tmp_path, FAULT, "raise", "2")
    bg_v = _verdict(env, bg_handle, tmp_path)
    sl_handle, _ = _slurm(slurm_cluster, tmp_path, "same-fault", FAULT, "raise", "2")
    sl_v = _verdict(slurm_cluster.client_env(), sl_handle, tmp_path)
    want = ("user-exception", 2, "ValueError: planted failure on rank 2", "planted_fault.py:21", (0, 1, 3))
    assert _essence(fg_v) == _essence(bg_v) == _essence(sl_v) == want, (fg_v, bg_v, sl_v)


@pytest.mark.cluster("slurm")
def test_hang_verdict_is_the_same_on_every_path(slurm_cluster: Any, clean_user_env: None, tmp_path: Path) -> None:
    env = _env()
    fg = torchhpc(env, "run", "-n", "4", "--hang-timeout", hang_timeout(20), HANG, "3", cwd=tmp_path, timeout=200)
    fg_v = _verdict(env, _local_handle(fg.stderr), tmp_path)
    bg_handle, _ = _background(env, tmp_path, HANG, "3", wait=("--hang-timeout", hang_timeout(20)))
    bg_v = _verdict(env, bg_handle, tmp_path)
    sl_handle, sl_err = _slurm(slurm_cluster, tmp_path, "same-hang", "--hang-timeout", hang_timeout(20), HANG, "3")
    sl_v = _verdict(slurm_cluster.client_env(), sl_handle, tmp_path)
    line = next(i for i, t in enumerate(Path(HANG).read_text().splitlines(), 1) if "time.sleep(3600)" in t)
    want = ("hang", 3, "not in a collective", f"planted_hang.py:{line}", (0, 1, 2))
    assert _essence(fg_v) == _essence(bg_v) == _essence(sl_v) == want, (fg_v, bg_v, sl_v, sl_err)
