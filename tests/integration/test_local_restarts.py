"""``--max-restarts`` and ``--hang-timeout`` of a local job, with no client watching
(supervisor/restarts.py): the foreground run's process and a background job's supervisor
restart the ranks after a hang, never after a user exception, and stop when the restarts are spent.

Nothing is faked: real gloo ranks really hang (tests/integration/scripts/hang_once.py) or raise.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

from tests.cli_run import torchhpc
from tests.conftest import hang_timeout, left_running
from tests.integration.test_diagnose_cluster import FAULT
from torchhpc.core.exitcodes import EXIT_CODES

HANG_ONCE = str(Path(__file__).parent / "scripts" / "hang_once.py")


def _attempts(handle: str, cwd: Path) -> list[tuple[object, object]]:
    st = json.loads(torchhpc(dict(os.environ), "status", handle, "--json", cwd=cwd).stdout)
    return [(a["class"], a["rank"]) for a in st["attempts"]]


def _handle(text: str) -> str:
    m = re.search(r"local:([0-9a-f]{10})", text) or re.search(r"jobs/local/([0-9a-f]{10})/", text)
    assert m, text
    return f"local:{m.group(1)}"


def _no_rank_left(tmp_path: Path) -> None:
    assert left_running(HANG_ONCE, tmp_path) == []


def test_a_foreground_hang_is_restarted_and_the_run_completes(clean_user_env: None, tmp_path: Path) -> None:
    r = torchhpc(dict(os.environ), "run", "-n", "2", "--hang-timeout", hang_timeout(5), "--max-restarts", "1", HANG_ONCE, "1",
                 cwd=tmp_path, timeout=200)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "rank 1 on localhost is not in a collective" in r.stderr, r.stderr  # the watch named the culprit
    assert "attempt 0 ended: hang; restart 1 of 1 (TORCHHPC_RESTART_COUNT=1)" in r.stderr, r.stderr
    # the watch stops the attempt, not the job: it said "cancel the job", then restarted (issue 51, item 6)
    assert "torchhpc: hang: cancelling the job" not in r.stderr, r.stderr
    assert "torchhpc: hang: stop this attempt (--max-restarts 1: the supervisor decides whether it restarts)" in r.stderr
    for rank in (0, 1):  # the second attempt's ranks know they are a restart, as under torchrun
        assert f"rank {rank} attempt 1 elastic 1" in r.stdout and f"rank {rank} done at attempt 1" in r.stdout, r.stdout
    assert _attempts(_handle(r.stderr), tmp_path) == [("hang", None), (None, None)]
    _no_rank_left(tmp_path)


def test_a_background_job_restarts_itself_with_no_client(clean_user_env: None, tmp_path: Path) -> None:
    quiet = hang_timeout(5)
    sub = torchhpc(dict(os.environ), "run", "-n", "2", "--background", "--hang-timeout", quiet, "--max-restarts", "1",
                   HANG_ONCE, "0", cwd=tmp_path)
    assert sub.returncode == 0 and f"Hang watch: in the job itself (--hang-timeout {quiet})" in sub.stdout, sub.stdout
    handle = _handle(sub.stdout)
    deadline = time.monotonic() + 180
    while True:  # no `wait`: only status, which watches nothing
        st = json.loads(torchhpc(dict(os.environ), "status", handle, "--json", cwd=tmp_path).stdout)
        if st["state"] not in ("PENDING", "RUNNING") or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert (st["state"], st["exit_code"]) == ("COMPLETED", 0), st
    assert [(a["class"], a["attempt"]) for a in st["attempts"]] == [("hang", 0), (None, 1)], st
    logs = torchhpc(dict(os.environ), "logs", handle, cwd=tmp_path).stdout
    assert "rank 0 done at attempt 1" in logs and "restart 1 of 1" in logs, logs
    _no_rank_left(tmp_path)


def test_a_user_exception_is_never_restarted_locally(clean_user_env: None, tmp_path: Path) -> None:
    r = torchhpc(dict(os.environ), "run", "-n", "2", "--max-restarts", "3", FAULT, "raise", "1", cwd=tmp_path,
                 timeout=200)
    assert r.returncode == EXIT_CODES["user-exception"], r.stderr  # supervised: the class's code
    assert "not restarting after user-exception" in r.stderr and "diagnosis: user-exception" in r.stderr, r.stderr
    assert _attempts(_handle(r.stderr), tmp_path) == [("user-exception", 1)]


def test_when_the_restarts_are_spent_the_run_ends_with_the_hang(clean_user_env: None, tmp_path: Path) -> None:
    quiet = hang_timeout(5)
    r = torchhpc(dict(os.environ), "run", "-n", "2", "--hang-timeout", quiet, "--max-restarts", "1", HANG_ONCE, "1",
                 "always", cwd=tmp_path, timeout=200)
    assert r.returncode == EXIT_CODES["hang"], r.stdout + r.stderr  # the class's code, not the ranks' SIGTERM 143
    assert "not restarting: 1 restart allowed, 1 done" in r.stderr, r.stderr
    assert f"Error: the hang watch cancelled the run (--hang-timeout {quiet})" in r.stderr, r.stderr
    assert "diagnosis: hang" in r.stderr, r.stderr
    assert _attempts(_handle(r.stderr), tmp_path) == [("hang", None), ("hang", None)]
    _no_rank_left(tmp_path)


def test_a_hang_before_the_first_checkpoint_stops_after_three_attempts(clean_user_env: None, tmp_path: Path) -> None:
    """Issue 44's acceptance: 5 restarts allowed, but the program hangs each time before it saves
    anything: the third attempt without a checkpoint advance ends the run with no-progress."""
    (tmp_path / "ckpt").mkdir()
    r = torchhpc(dict(os.environ), "run", "-n", "2", "--hang-timeout", hang_timeout(5), "--max-restarts", "5",
                 "--checkpoint-dir", "ckpt", HANG_ONCE, "1", "always", cwd=tmp_path, timeout=400)
    assert r.returncode == EXIT_CODES["no-progress"], r.stdout + r.stderr
    assert "restart storm: hang x3 before the first checkpoint, no checkpoint advance" in r.stderr, r.stderr
    handle = _handle(r.stderr)
    # the job's class is the last attempt's in attempts.json, and the verdict's (it said hang x3 and "hang")
    assert _attempts(handle, tmp_path) == [("hang", None)] * 2 + [("no-progress", None)]
    want = "diagnosis: no-progress — restart storm: hang x3 before the first checkpoint, no checkpoint advance"
    assert want in r.stderr, r.stderr  # the foreground run's own verdict
    d = torchhpc(dict(os.environ), "diagnose", handle, cwd=tmp_path)
    assert d.returncode == 1 and d.stdout.startswith(want), d.stdout
    assert "the last attempt: hang — " in d.stdout.splitlines()[0], d.stdout
    _no_rank_left(tmp_path)


def test_a_restart_tells_the_program_where_to_resume(clean_user_env: None, tmp_path: Path) -> None:
    """--on-restart-append: nothing added to the first attempt; the second gets the newest checkpoint."""
    script = str(Path(__file__).parent / "scripts" / "resume_when_told.py")
    r = torchhpc(dict(os.environ), "run", "-n", "1", "--max-restarts", "1", "--on-restart-append",
                 "--resume_from_checkpoint {latest:ckpt/checkpoint-*}", script, cwd=tmp_path, timeout=200)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "attempt 0 argv []" in r.stdout and "resumed from ckpt/checkpoint-10" in r.stdout, r.stdout
    assert "attempt 1 adds to the program: --resume_from_checkpoint ckpt/checkpoint-10" in r.stderr, r.stderr
    [record] = (tmp_path / "state").rglob("attempts.json")  # a run that completed prints no handle
    assert [(a["class"], a["rank"]) for a in json.loads(record.read_text())] == [("network", 0), (None, None)]
