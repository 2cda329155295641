"""Verdicts of local jobs that did not fail by themselves, through the CLI (issue 51, item 6): a run
interrupted with Ctrl-C, and a job that never started (``--after-ok`` of a job that failed)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.cli_run import torchhpc


def test_a_ctrl_c_run_is_said_interrupted_not_cancelled_by_someone(clean_user_env: None, tmp_path: Path) -> None:
    prog = "import time; print('up', flush=True); time.sleep(60)"
    p = subprocess.Popen([sys.executable, "-m", "torchhpc", "run", "-n", "2", "--", sys.executable, "-c", prog],
                         cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(list((tmp_path / "state").rglob("output.log"))) == 0:
            time.sleep(0.2)
        [log] = list((tmp_path / "state").rglob("output.log"))
        while time.monotonic() < deadline and log.read_text().count("up") < 2:
            time.sleep(0.2)
        p.send_signal(signal.SIGINT)  # what Ctrl-C sends the foreground run
        _out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, err
    handle = f"local:{log.parent.name}"
    d = torchhpc(dict(os.environ), "diagnose", handle, cwd=tmp_path)
    assert d.stdout.startswith("diagnosis: cancelled — the run was interrupted with Ctrl-C (SIGINT)"), d.stdout
    assert "scancel" not in d.stdout and "by a user" not in d.stdout, d.stdout


def test_a_job_that_never_started_has_a_verdict_that_says_so(clean_user_env: None, tmp_path: Path) -> None:
    env = dict(os.environ)
    first = torchhpc(env, "run", "-n", "1", "--background", "--", sys.executable, "-c", "raise SystemExit(3)", cwd=tmp_path)
    a = re.search(r"Submitted (local:\S+)", first.stdout)
    assert a, first.stdout + first.stderr
    torchhpc(env, "wait", a.group(1), cwd=tmp_path, timeout=120)
    second = torchhpc(env, "run", "-n", "1", "--background", "--after-ok", a.group(1), "--", sys.executable, "-c",
                      "print(1)", cwd=tmp_path)
    b = re.search(r"Submitted (local:\S+)", second.stdout)
    assert b, second.stdout + second.stderr
    torchhpc(env, "wait", b.group(1), cwd=tmp_path, timeout=120)
    d = torchhpc(env, "diagnose", b.group(1), cwd=tmp_path)
    assert d.stdout.startswith("diagnosis: cancelled — the job never started"), d.stdout
    assert "torchhpc logs" not in d.stdout and "failed as a consequence" not in d.stdout, d.stdout
    assert "scancel" not in d.stdout, d.stdout
