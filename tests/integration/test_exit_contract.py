"""One exit-code contract (issue 50): what a local job's process exits with is what its record says,
wherever the record is read back: ``status --json``, ``events --json`` (the end event) and
``diagnose --json``.

Each case is a real local run (real processes, real signals): success, an exception, an exception
under ``--hang-timeout`` (its own code, 1: the watch changes only a hang's), a hang the watch names and stops (81), Ctrl-C
(SIGINT to the client, 130), Ctrl-C while the run waits on ``--after-ok`` (130), ``torchhpc cancel``
(143) and SIGKILL of the client (137: the shell's code, which the record must not contradict).
The foreground cases are the shell's exit; the background ones are ``torchhpc wait``'s.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import hang_timeout, reaped

TORCHHPC = [sys.executable, "-m", "torchhpc"]
RAISE = "raise ValueError('planted')"
SLEEP = "import time; print('up', flush=True); time.sleep(300)"


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TORCHHPC, *args], capture_output=True, text=True, timeout=timeout)


def _last_handle() -> str:
    done = _cli("list", "--last")
    assert done.returncode == 0 and done.stdout.startswith("local:"), done.stdout + done.stderr
    return done.stdout.split()[0]


def _record_codes(handle: str) -> tuple[object, object, object]:
    """(status --json, events --json end, diagnose --json): each the exit code it reports."""
    st = json.loads(_cli("status", "--json", handle).stdout)["exit_code"]
    events = json.loads(_cli("events", "--json", handle).stdout)["events"]
    ends = [e["text"] for e in events if e["kind"] == "end"]
    assert len(ends) == 1, events
    m = re.search(r"exit (\d+)", ends[0])
    end = int(m.group(1)) if m else (0 if ends[0].startswith("COMPLETED") else None)
    diag = json.loads(_cli("diagnose", "--json", handle).stdout)["exit_code"]
    return st, end, diag


def _wait_for_line(proc: subprocess.Popen[str], text: str, timeout: float = 60) -> None:
    """Until the run's output shows ``text`` (its rank is up) or the timeout."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    for line in proc.stdout:
        if text in line:
            return
        if time.monotonic() > deadline:
            break
    pytest.fail(f"no {text!r} from the run within {timeout:.0f}s")


def _foreground(*args: str, act: str = "", ready: str = "up") -> int:
    """A foreground run; ``act``: what happens to the client once the rank printed ``ready``."""
    proc = subprocess.Popen([*TORCHHPC, "run", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with reaped([proc]):
        if act:
            _wait_for_line(proc, ready)
            if act == "cancel":
                assert _cli("cancel", _last_handle()).returncode == 0
            else:
                proc.send_signal({"int": signal.SIGINT, "kill": signal.SIGKILL}[act])
        wait = 60 if act else 180  # once signalled, the client ends in a second; a minute is the load's margin
        try:
            proc.communicate(timeout=wait)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the client was still running {wait} s after {act or 'its start'}: {_where(proc.pid)}")
    code = proc.returncode
    return 128 - code if code < 0 else code  # a signal death, as the shell reports it


def _where(pid: int) -> str:
    """What a stuck client and its children are doing: each process's state, kernel wait channel and line."""
    ps = subprocess.run(["ps", "-o", "pid,ppid,stat,wchan:24,etime,args", "--pid", str(pid), "--ppid", str(pid)],
                        capture_output=True, text=True).stdout
    try:  # what it does with signals: ignored, blocked, caught, pending (hex masks, bit N-1 for signal N)
        masks = " ".join(line.replace("\t", "") for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                         if line.startswith(("SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt")))
    except OSError:
        masks = "(gone)"
    threads = [masks]
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            threads.append(f"{task.name}:{(task / 'wchan').read_text()}")
        except OSError:
            continue
    return f"threads {' '.join(threads)}\n{ps}"


def _background(*args: str, cancel: bool = False) -> int:
    done = _cli("run", "--background", *args)
    assert done.returncode == 0, done.stdout + done.stderr
    handle = _last_handle()
    if cancel:
        time.sleep(2)
        assert _cli("cancel", handle).returncode == 0
    return _cli("wait", handle, "--timeout", "150", timeout=200).returncode


CASES = {
    "success": (["-n", "1", "--", sys.executable, "-c", "pass"], "", 0),
    "exception": (["-n", "1", "--", sys.executable, "-c", RAISE], "", 1),
    "exception, --hang-timeout": (["-n", "1", "--hang-timeout", hang_timeout(30), "--", sys.executable, "-c", RAISE], "", 1),
    "hang": (["-n", "2", "--hang-timeout", hang_timeout(5), "--", sys.executable, "-c", SLEEP], "", 81),
    "ctrl-c": (["-n", "2", "--", sys.executable, "-c", SLEEP], "int", 130),
    "cancel": (["-n", "2", "--", sys.executable, "-c", SLEEP], "cancel", 143),
    "sigkill of the client": (["-n", "1", "--", sys.executable, "-c", SLEEP], "kill", 137),
}


@pytest.mark.parametrize("case", list(CASES))
def test_foreground_exit_is_the_record(case: str) -> None:
    args, act, want = CASES[case]
    code = _foreground(*args, act=act)
    assert code == want, f"{case}: exited {code}, want {want}"
    handle = _last_handle()
    assert _record_codes(handle) == (want, want, want), f"{case}: exit {code}"


def test_ctrl_c_while_waiting_on_a_dependency_is_recorded_130() -> None:
    dep = _cli("run", "--background", "-n", "1", "--", sys.executable, "-c", SLEEP)
    assert dep.returncode == 0, dep.stderr
    first = _last_handle()
    try:
        code = _foreground("--after-ok", first, "-n", "1", "--", sys.executable, "-c", "pass", act="int",
                           ready="waiting")
        assert code == 130
        handle = _last_handle()
        assert handle != first
        st = json.loads(_cli("status", "--json", handle).stdout)
        assert (st["state"], st["exit_code"]) == ("CANCELLED", 130), st
        assert _record_codes(handle) == (130, 130, 130)
    finally:
        _cli("cancel", first)


NAP = "import time; print('up', flush=True); time.sleep(4); print('done', flush=True)"


@pytest.mark.parametrize("ignored", [True, False], ids=["nohup", "terminal"])
def test_a_hangup_stops_a_foreground_run_unless_nohup_ignored_it(ignored: bool) -> None:
    """`nohup torchhpc run ... &` starts with SIGHUP ignored: the run outlives the terminal and ends 0.
    From a terminal, SIGHUP (the terminal closed) stops the ranks and the run is recorded 129."""
    def start() -> None:
        signal.signal(signal.SIGHUP, signal.SIG_IGN if ignored else signal.SIG_DFL)

    proc = subprocess.Popen([*TORCHHPC, "run", "-n", "2", "--", sys.executable, "-c", NAP], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, preexec_fn=start)
    with reaped([proc]):
        _wait_for_line(proc, "up")
        proc.send_signal(signal.SIGHUP)
        out, _ = proc.communicate(timeout=60)
    want = 0 if ignored else 129
    assert proc.returncode == want, out
    assert ("done" in out) == ignored, out
    assert _record_codes(_last_handle()) == (want, want, want)


@pytest.mark.parametrize("case", ["success", "exception", "exception, --hang-timeout", "hang", "cancel"])
def test_background_wait_exit_is_the_record(case: str) -> None:
    args, act, want = CASES[case]
    code = _background(*args, cancel=act == "cancel")
    assert code == want, f"{case}: wait exited {code}, want {want}"
    assert _record_codes(_last_handle()) == (want, want, want)


def test_wait_timeout_has_its_own_code() -> None:
    assert _cli("run", "--background", "-n", "1", "--", sys.executable, "-c", SLEEP).returncode == 0
    handle = _last_handle()
    try:
        done = _cli("wait", handle, "--timeout", "2")
        assert done.returncode == 124, done.stderr  # not 1: the job did not fail
        assert "timed out" in done.stderr and "Traceback" not in done.stderr
        assert json.loads(_cli("status", "--json", handle).stdout)["state"] == "RUNNING"
    finally:
        _cli("cancel", handle)


def _ranks_of(handle: str) -> list[str]:
    mark = f"TORCHELASTIC_RUN_ID=local-{handle.split(':')[1]}".encode()
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if mark in (entry / "environ").read_bytes().split(b"\0"):
                found.append(entry.name)
        except OSError:
            continue
    return found


def test_a_sigkilled_client_stops_its_clock_and_its_ranks() -> None:
    """`list` must not keep counting a killed foreground run's time as the job's, and a job recorded
    as ended must not leave its ranks computing (each leads its own session, so they outlive the client)."""
    _foreground("-n", "2", "--", sys.executable, "-c", SLEEP, act="kill")
    handle = _last_handle()
    first = json.loads(_cli("status", "--json", handle).stdout)["elapsed"]
    assert _ranks_of(handle) == [], "the ranks of the killed run still run"
    time.sleep(1.5)
    assert json.loads(_cli("status", "--json", handle).stdout)["elapsed"] == first
    assert os.environ.get("TORCHHPC_STATE_DIR"), "the integration conftest keeps the store in a temporary folder"


def test_the_code_table_is_in_run_wait_and_readme() -> None:
    from tests.conftest import REPO
    from torchhpc.core.exitcodes import help_table

    table = help_table()
    for cmd in ("run", "wait", "status"):
        assert table in _cli(cmd, "--help").stdout.replace("\r", ""), cmd
    assert table in (REPO / "README.md").read_text()
    assert Path(REPO / "docs" / "cli.md").read_text().count("124      wait --timeout") >= 2
