"""The suite's own rules (tests/conftest.py): a process left running is found, a timed-out Popen is reaped."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from tests.conftest import SESSION_VAR, reaped, session_processes


def test_a_process_the_session_started_is_found_until_it_ends() -> None:
    marker = uuid.uuid4().hex
    env = {**os.environ, SESSION_VAR: marker}
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        assert [line.split()[0] for line in session_processes(marker)] == [str(proc.pid)]
    finally:
        proc.kill()
        proc.wait()
    assert session_processes(marker) == []


def test_reaped_kills_what_a_timeout_left_running() -> None:
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stdout=subprocess.PIPE)]
    with pytest.raises(subprocess.TimeoutExpired), reaped(procs):
        procs[0].communicate(timeout=0.2)
    assert procs[0].returncode is not None  # killed and waited for: no zombie, no open pipe
    assert procs[0].stdout is not None and procs[0].stdout.closed
