"""Warm restarts (boot/warm.py): a real standby process, real clients started by the real task shim.

The standby preloads ``json`` instead of torch (the same path, without two seconds of CPU per test): a
program that finds ``json`` already in ``sys.modules`` before importing anything ran in the standby's fork.
Each test's standby has a node name of its own (``SLURMD_NODENAME``), so its abstract socket is its own.
The cluster runs of the same path are tests/integration/test_resilience.py's restarts and
benchmarks/recovery.py --parts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from torchhpc.boot import warm
from torchhpc.launchers.boot import BOOT_DIR
from torchhpc.supervisor.standby import PYTHON_VAR, SWITCH, WARM_VAR, Standby

WARM_PY = os.path.join(BOOT_DIR, "warm.py")
TASK_SH = os.path.join(BOOT_DIR, "task.sh")

PROGRAM = """\
import os, sys
warm = "json" in sys.modules
print(json_line := __import__("json").dumps({"warm": warm, "argv": sys.argv, "cwd": os.getcwd(), "x": os.environ.get("X"),
      "rank": os.environ.get("RANK"), "pid": os.getpid(), "name": __name__}), flush=True)
if sys.argv[1:2] == ["sleep"]:
    import time
    time.sleep(60)
if sys.argv[1:2] == ["raise"]:
    raise ValueError("bad value")
if sys.argv[1:2] == ["sigkill"]:
    os.kill(os.getpid(), 9)
sys.exit(int(sys.argv[1]) if sys.argv[1:2] and sys.argv[1].isdigit() else 0)
"""


def test_the_names_are_the_same_on_both_sides() -> None:
    assert (warm.WARM_VAR, warm.PYTHON_VAR) == (WARM_VAR, PYTHON_VAR)
    assert f'environ.get("{WARM_VAR}")' in Path(BOOT_DIR, "sitecustomize.py").read_text()  # the agent's hand-off
    assert f"${WARM_VAR}" in Path(TASK_SH).read_text() or WARM_VAR in Path(TASK_SH).read_text()
    assert PYTHON_VAR in Path(TASK_SH).read_text()


@pytest.fixture
def standby(tmp_path: Path) -> Iterator[dict[str, str]]:
    """A standby on "node" ``n<pid>``, and the environment a restarted rank has there."""
    node = f"n{os.getpid()}-{time.monotonic_ns()}"
    env = {"PATH": os.environ["PATH"], "SLURMD_NODENAME": node}
    proc = subprocess.Popen([sys.executable, WARM_PY, "serve", "t-warm", "json"], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and "ready" in proc.stdout.readline()
        yield {**env, WARM_VAR: "t-warm", PYTHON_VAR: sys.executable, "TORCHHPC_BOOT_DIR": BOOT_DIR, "X": "y z"}
    finally:
        proc.kill()
        proc.wait()


def _task(tmp_path: Path, env: dict[str, str], *args: str, **kw: object) -> subprocess.Popen[str]:
    (tmp_path / "prog.py").write_text(PROGRAM)
    return subprocess.Popen(["bash", TASK_SH, "none", sys.executable, str(tmp_path / "prog.py"), *args], env=env,
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)  # type: ignore[call-overload]


def test_a_restarted_rank_runs_in_the_standby_with_its_own_argv_env_cwd_and_code(tmp_path: Path,
                                                                                  standby: dict[str, str]) -> None:
    p = _task(tmp_path, {**standby, "RANK": "3", "WORLD_SIZE": "4", "TORCHHPC_RANKS_DIR": str(tmp_path / "ranks")}, "7")
    out, err = p.communicate(timeout=60)
    seen = json.loads(out.splitlines()[0])
    assert seen["warm"] and seen["name"] == "__main__", (out, err)
    assert (seen["argv"], seen["cwd"], seen["x"], seen["rank"]) == ([str(tmp_path / "prog.py"), "7"], str(tmp_path), "y z", "3")
    assert p.returncode == 7 and "cold start" not in err
    mark = json.loads((tmp_path / "ended" / "rank-3").read_text())  # the boot's return mark ran in the fork
    assert (mark["rank"], mark["how"], mark["pid"]) == (3, "exit 7", seen["pid"])


def test_an_exception_prints_its_traceback_and_exits_1(tmp_path: Path, standby: dict[str, str]) -> None:
    p = _task(tmp_path, standby, "raise")
    out, err = p.communicate(timeout=60)
    assert p.returncode == 1 and "ValueError: bad value" in err and json.loads(out.splitlines()[0])["warm"]
    assert err.splitlines()[1].startswith(f'  File "{tmp_path / "prog.py"}"'), err  # as a cold rank's: no warm.py, no runpy
    assert "warm.py" not in err and "runpy" not in err and "During handling" not in err, err


def test_a_signal_reaches_the_rank_and_a_killed_client_takes_it_along(tmp_path: Path, standby: dict[str, str]) -> None:
    p = _task(tmp_path, standby, "sleep")
    assert p.stdout is not None
    pid = json.loads(p.stdout.readline())["pid"]
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=60) == -signal.SIGTERM  # the client ends as its rank did: by the signal
    q = _task(tmp_path, standby, "sleep")
    assert q.stdout is not None
    pid = json.loads(q.stdout.readline())["pid"]
    q.kill()  # srun's SIGKILL: the client cannot pass it on
    q.wait()
    deadline = time.monotonic() + 30
    while _alive(pid):
        assert time.monotonic() < deadline, "the rank outlived its client"
        time.sleep(0.05)


def test_a_rank_killed_by_sigkill_ends_its_client_by_sigkill(tmp_path: Path, standby: dict[str, str]) -> None:
    """The launcher reads the rank's end from the client: SIGKILL, whose handler cannot be reset, as any other."""
    p = _task(tmp_path, standby, "sigkill")
    _out, err = p.communicate(timeout=60)
    assert p.returncode == -signal.SIGKILL and "Traceback" not in err, err


def test_sigterm_to_the_standby_leaves_its_ranks_to_their_own_signal(tmp_path: Path) -> None:
    """Run 23: at a time limit Slurm signals every step; the standby's SIGTERM killed its ranks at once (SIGKILL),
    so the job's end read 137 where accounting says 143. Now the standby ends after its ranks, by their own end."""
    node = f"n{os.getpid()}-{time.monotonic_ns()}"
    env = {"PATH": os.environ["PATH"], "SLURMD_NODENAME": node}
    proc = subprocess.Popen([sys.executable, WARM_PY, "serve", "t-term", "json"], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and "ready" in proc.stdout.readline()
        p = _task(tmp_path, {**env, WARM_VAR: "t-term", PYTHON_VAR: sys.executable, "TORCHHPC_BOOT_DIR": BOOT_DIR}, "sleep")
        assert p.stdout is not None
        pid = json.loads(p.stdout.readline())["pid"]
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert proc.poll() is None and _alive(pid), "the standby ended its rank at its own SIGTERM"
        os.kill(pid, signal.SIGTERM)  # Slurm's SIGTERM to the rank itself
        assert p.wait(timeout=60) == -signal.SIGTERM
        assert proc.wait(timeout=30) is not None  # its last rank gone: the standby too
    finally:
        proc.kill()
        proc.wait()


def _alive(pid: int) -> bool:
    try:  # gone, or gone between the two looks (its /proc entry then reads as ProcessLookupError): not alive
        os.kill(pid, 0)
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (ProcessLookupError, FileNotFoundError):
        return False
    return stat.split(") ", 1)[1][0] != "Z"  # a zombie has ended


@pytest.mark.parametrize("why", ["no standby", "another python", "a command"])
def test_what_cannot_start_warm_starts_cold_and_says_so(tmp_path: Path, standby: dict[str, str], why: str) -> None:
    env = dict(standby)
    if why == "no standby":
        env[WARM_VAR] = "t-nobody"
    elif why == "another python":
        env[PYTHON_VAR] = "/no/such/python"
    (tmp_path / "prog.py").write_text(PROGRAM)
    argv = ([sys.executable, "-c", PROGRAM, "5"] if why == "a command" else [sys.executable, str(tmp_path / "prog.py"), "5"])
    p = subprocess.run(["bash", TASK_SH, "none", *argv], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert p.returncode == 5 and "cold start" in p.stderr, p.stderr
    assert not json.loads(p.stdout.splitlines()[0])["warm"]


def test_a_module_starts_warm(tmp_path: Path, standby: dict[str, str]) -> None:
    (tmp_path / "mymod.py").write_text(PROGRAM)
    p = subprocess.run(["bash", TASK_SH, "none", sys.executable, "-u", "-m", "mymod", "4"], env=standby, cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    seen = json.loads(p.stdout.splitlines()[0])
    assert p.returncode == 4 and seen["warm"] and seen["argv"][1:] == ["4"], p.stderr


def test_the_standby_is_started_once_per_node_and_named_for_every_attempt() -> None:
    started: list[tuple[list[str], str, dict[str, str], str]] = []

    class Alloc:
        def start_watch(self, argv: list[str], node: str, env: dict[str, str], name: str = "") -> None:
            started.append((argv, node, env, name))

    said: list[str] = []
    env = {"PYTHONPATH": f"{BOOT_DIR}{os.pathsep}/mine", "TORCHHPC_HEARTBEAT": "h:1", "PATH": "/bin", SWITCH: "on"}
    s = Standby(Alloc(), "42", "/py", env, said.append)
    s.start(["n1", "n2"])
    s.start(["n2", "n3"])
    assert [n for _a, n, _e, _s in started] == ["n1", "n2", "n3"]
    argv, _n, senv, step = started[0]
    assert argv == ["/py", WARM_PY, "serve", "torchhpc-warm-42", "torch"] and step == "torchhpc-warm"
    assert senv == {"PYTHONPATH": "/mine", "PATH": "/bin", SWITCH: "on"}  # no boot, no heartbeat: a forking process has no threads
    assert s.env_for(0) == s.env_for(1) == {WARM_VAR: "torchhpc-warm-42", PYTHON_VAR: "/py"}
    off = Standby(Alloc(), "43", "/py", {SWITCH: "off"}, said.append)
    off.start(["n1"])
    assert len(started) == 3 and off.env_for(1) == {}
    agent = Standby(Alloc(), "44", "/py", env, said.append, agent=True)  # torchrun: its agent runs the boot on a restart
    agent.start(["n1"])
    assert agent.env_for(0) == agent.env_for(1) and agent.env_for(1)["PYTHONPATH"] == f"{BOOT_DIR}{os.pathsep}/mine"


def _children(pid: int) -> list[int]:
    """The living processes whose parent is ``pid``."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(") ", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[1] == str(pid) and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


def test_torchruns_agent_on_a_restart_runs_in_the_standby_and_its_end_takes_its_workers(tmp_path: Path) -> None:
    """torchrun's agent (``python -m torch.distributed.run``) with a standby named: the boot's sitecustomize
    hands it to the standby before it imports anything, and its worker starts warm through the task shim, so
    both are forks of the standby (torch imported once). srun's SIGKILL of the agent's client then takes the
    agent and the worker it started, though torchrun starts each worker in a session of its own."""
    env = {"PATH": os.environ["PATH"], "SLURMD_NODENAME": f"a{os.getpid()}-{time.monotonic_ns()}"}
    standby = subprocess.Popen([sys.executable, WARM_PY, "serve", "t-agent", "torch"], env=env, stdout=subprocess.PIPE,
                               text=True)
    try:
        assert standby.stdout is not None and "ready" in standby.stdout.readline()
        (tmp_path / "prog.py").write_text(PROGRAM.replace('"json" in sys.modules', '"torch" in sys.modules'))
        agent = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1", "--no-python",
             "bash", TASK_SH, "torchrun", sys.executable, str(tmp_path / "prog.py"), "sleep"],
            env={**env, WARM_VAR: "t-agent", PYTHON_VAR: sys.executable, "TORCHHPC_BOOT_DIR": BOOT_DIR,
                 "PYTHONPATH": Standby(None, "", sys.executable, {}, print, agent=True).agent_path},  # a restart's
            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert agent.stdout is not None
        seen = json.loads(agent.stdout.readline())
        assert seen["warm"] and seen["rank"] == "0", seen
        assert len(_children(standby.pid)) == 2, "the agent and its worker: both forks of the standby"
        agent.kill()  # srun's SIGKILL of the attempt: the agent's client cannot pass it on
        _out, err = agent.communicate()
        deadline = time.monotonic() + 30
        while _children(standby.pid) or _alive(seen["pid"]):
            assert time.monotonic() < deadline, f"left running: {_children(standby.pid)}, worker {seen['pid']}"
            time.sleep(0.05)
        assert "cold start" not in err, err
    finally:
        standby.kill()
        standby.wait()


def test_the_hang_probe_finds_a_warm_rank_in_the_standbys_fork(tmp_path: Path, standby: dict[str, str]) -> None:
    """A forked rank's /proc environ is the standby's: the probe follows its client (named ``warm:PID``).
    The name has no space: Slurm's proctrack/linuxproc misreads /proc/PID/stat for one, and a step's signals
    then pass the client by (a stale rank lived on after its step was cancelled)."""
    from torchhpc.diagnose.probe import find_ranks

    run_id = f"t-probe-{time.monotonic_ns()}"
    p = _task(tmp_path, {**standby, "RANK": "1", "THPC_PROBE_ID": run_id}, "sleep")  # task.sh unsets TORCHELASTIC_*
    try:
        assert p.stdout is not None
        pid = json.loads(p.stdout.readline())["pid"]
        assert pid != p.pid and find_ranks({"THPC_PROBE_ID": run_id}) == {1: pid}
        stat = Path(f"/proc/{p.pid}/stat").read_text()
        assert stat.split()[1] == f"(warm:{pid})" and int(stat.split()[3]) == os.getpid()  # scanf-readable
    finally:
        p.kill()
        p.wait()
    deadline = time.monotonic() + 30  # the standby takes the rank along before the fixture stops it
    while _alive(pid):
        assert time.monotonic() < deadline, "the rank outlived its client"
        time.sleep(0.05)


def test_a_standby_whose_starter_is_gone_ends(tmp_path: Path) -> None:
    """A local run killed outright leaves no standby behind: it watches its parent."""
    env = {"PATH": os.environ["PATH"], "SLURMD_NODENAME": f"n{os.getpid()}-{time.monotonic_ns()}"}
    serve = f"{sys.executable} {WARM_PY} serve t-orphan json >/dev/null 2>&1"
    starter = subprocess.run(["sh", "-c", f"{serve} & echo $!; sleep 1"],  # alive while the standby starts
                             env=env, capture_output=True, text=True, timeout=60)
    pid = int(starter.stdout.strip())
    deadline = time.monotonic() + 30
    while _alive(pid):
        assert time.monotonic() < deadline, "the standby outlived the process that started it"
        time.sleep(0.05)
