"""One handle, one answer (issue 50): every job command takes a job the same way and says the same
thing of an unknown one.

Each of ``status wait cancel logs diagnose events top`` runs against: a real local job by its bare
id (the id a run prints) and by its full handle, which must agree; an unknown job (``Error: no job
...`` + ``HINT: ... torchhpc list``, exit 2, never a verdict such as "completed"); a handle of
another scheduler (its own answer, never a traceback); and a bare id with ``--scheduler`` of
another scheduler. No command may print a Python traceback in any case.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TORCHHPC = [sys.executable, "-m", "torchhpc"]
COMMANDS = ("status", "wait", "cancel", "logs", "diagnose", "events", "top")
EXTRA = {"top": ["--once"], "wait": ["--timeout", "60"]}


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TORCHHPC, *args], capture_output=True, text=True, timeout=120, env=env)


@pytest.fixture(scope="module")
def done_job() -> str:
    """A local job that ran and completed: its bare id, as `torchhpc list --last` shows it."""
    ran = _cli("run", "-n", "2", "--", sys.executable, "-c", "print('hello')")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    last = _cli("list", "--last").stdout.split()[0]
    assert last.startswith("local:")
    return last.split(":", 1)[1]


def _plain(env_extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TORCHHPC_SCHEDULER"}
    return {**env, **(env_extra or {})}


@pytest.mark.parametrize("command", COMMANDS)
def test_bare_id_and_full_handle_agree(command: str, done_job: str) -> None:
    bare = _cli(command, done_job, *EXTRA.get(command, []), env=_plain())
    full = _cli(command, f"local:{done_job}", *EXTRA.get(command, []), env=_plain())
    assert bare.returncode == full.returncode == 0, (bare.stderr, full.stderr)
    assert "Traceback" not in bare.stderr + full.stderr
    assert bare.stdout == full.stdout or command in ("top",), (bare.stdout, full.stdout)
    if command == "diagnose":
        assert "completed" in bare.stdout


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("handle", ["zzzz00", "local:zzzz00"])
def test_an_unknown_job_is_one_error_everywhere(command: str, handle: str) -> None:
    done = _cli(command, handle, *EXTRA.get(command, []), env=_plain())
    assert done.returncode == 2, (command, done.stdout, done.stderr)  # a handle is input: 2, never a failed job's 1
    lines = done.stderr.strip().splitlines()
    assert lines[0].startswith("Error: no job local:zzzz00"), done.stderr
    assert lines[-1].startswith("HINT: ") and "torchhpc list" in lines[-1], done.stderr
    assert "Traceback" not in done.stderr and "completed" not in done.stdout


@pytest.mark.parametrize("command", COMMANDS)
def test_a_handle_of_another_scheduler_gets_that_schedulers_answer(command: str, tmp_path: Path) -> None:
    """pbs:7.server on a machine without PBS: its commands are missing; said in one Error line, exit 1."""
    env = _plain({"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"})
    done = _cli(command, "pbs:7.server", *EXTRA.get(command, []), env=env)
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("Error: "), done.stderr
    assert "local" not in done.stderr.split("\n")[0], done.stderr  # never sent to the local scheduler


@pytest.mark.parametrize("command", COMMANDS)
def test_a_bare_id_follows_scheduler_and_its_variable(command: str, done_job: str) -> None:
    """`--scheduler pbs` and $TORCHHPC_SCHEDULER=pbs send the same bare id to PBS, for every command."""
    env = _plain({"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"})
    flag = _cli(command, done_job, "--scheduler", "pbs", *EXTRA.get(command, []), env=env)
    var = _cli(command, done_job, *EXTRA.get(command, []), env={**env, "TORCHHPC_SCHEDULER": "pbs"})
    for done in (flag, var):
        assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.startswith("Error: ") and f"local:{done_job}" not in done.stderr, done.stderr
    assert flag.stderr == var.stderr


@pytest.mark.parametrize("command", COMMANDS)
def test_no_job_given_is_a_usage_error_in_the_clis_style(command: str) -> None:
    done = _cli(command, env=_plain())
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert lines[0] == f"Error: torchhpc {command}: missing JOB", done.stderr
    assert lines[1].startswith("HINT: usage: "), done.stderr


def test_after_ok_of_an_unknown_job_is_refused_before_any_wait() -> None:
    done = subprocess.run([*TORCHHPC, "run", "--after-ok", "local:zzzz00", "-n", "1", "--", sys.executable, "-c", "pass"],
                          capture_output=True, text=True, timeout=30, env=_plain())
    assert done.returncode == 2 and done.stderr.startswith("Error: no job local:zzzz00 (from --after-ok)"), done.stderr
