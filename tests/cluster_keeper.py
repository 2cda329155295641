"""The shared dev cluster's nodes kept serving through the run: a slurmd that dies or stops answering on its
own is started again, and the run says so.

A real node's init restarts a daemon that dies; a dev cluster node has none. Slurm 22.05.8's slurmd aborted
once here (heap damage in ``slurm_hostlist_create_dims``, docs/script.md), and a landing CI run ended with
two tests waiting minutes for node1 (a 4-node job PENDING 211 s, ``srun -w node1`` queued 120 s) while every
other test ran on the three other nodes. One node lost that way fails whatever test next needs it, for the
rest of the run.

Run 33 (docs/testing.md) showed the landing CI's case: node1 drained, reason "Kill task failed": a step the
supervisor cancelled (a planted hang) still had a process 60 s after its SIGKILL (Slurm's UnkillableStepTimeout),
and Slurm drains such a node; which process, the logs do not say.

In the run's controller (xdist's, or pytest's own process), a thread looks at the shared cluster every
``POLL_S``. A node that is not failed on purpose (``devcluster fail`` records the node before it kills) and
whose slurmd is dead for two looks in a row, or alive but not answering the controller (``*`` in sinfo's
state) for ``HUNG_S``, gets its slurmd killed and started again, as ``devcluster revive`` does. A node drained
"Kill task failed" has what is left on it written down (PID, state, wait channel, age, command) and is
resumed. The
summary names each restart with the tail of the daemon's logs and each resume with its evidence, and a cluster test that fails shows
the nodes and the queue at that moment (tests/integration/conftest.py): the next post-mortem has its evidence.
Nothing is restarted while ``devcluster up``/``down`` holds the state dir's lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

POLL_S = 2.0
HUNG_S = 30.0  # slurmctld itself gives a silent node SlurmdTimeout=10 s before it calls it DOWN
UNKILLABLE = "Kill task failed"  # Slurm's reason for a node whose step outlived SIGKILL (UnkillableStepTimeout)
_KEEPER = pytest.StashKey["Keeper"]()


def node_states(state: Any) -> dict[str, str]:
    """``node -> sinfo's short state`` (``idle``, ``mix``, ``down*``...) of the cluster; {} when sinfo fails."""
    return {n: t for n, (t, _reason) in _nodes(state).items()}


def _nodes(state: Any) -> dict[str, tuple[str, str]]:
    """``node -> (short state, reason)``; {} when sinfo fails."""
    try:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N|%t|%E"], env=state.client_env(), capture_output=True,
                             text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    rows = [line.split("|", 2) for line in out.splitlines()]
    return {r[0]: (r[1], r[2]) for r in rows if len(r) == 3}


def processes_of(state: Any, node: str) -> list[str]:
    """``PID STATE WCHAN AGE COMM CMDLINE`` of every process on ``node`` but its slurmd: what a step left."""
    from torchhpc.devcluster import netns

    slurmd = {d.pid for d in state.daemons if d.name == f"slurmd-{node}"}
    rows, boot = [], time.time() - time.monotonic()
    for pid in netns.pids_in([state.netns(node)]):
        if pid in slurmd:
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            with open(f"/proc/{pid}/wchan") as f:
                wchan = f.read() or "-"
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:160]
        except OSError:
            continue  # gone meanwhile
        comm, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        age = time.time() - (boot + int(rest[19]) / os.sysconf("SC_CLK_TCK"))
        rows.append(f"{pid} {rest[0]} ppid {rest[1]} {wchan} {age:.0f}s ({comm}) {cmd}")
    return rows


def cluster_now(state: Any) -> str:
    """The nodes with their reasons and the queue, as text for a failed test's report."""
    parts = []
    for argv in (["sinfo", "-N", "-o", "%N %t %E %C"], ["squeue", "-o", "%i %j %T %r %D %C %N %M"]):
        try:
            done = subprocess.run(argv, env=state.client_env(), capture_output=True, text=True, timeout=20)
            parts.append(f"$ {' '.join(argv)}\n{done.stdout}{done.stderr}")
        except (OSError, subprocess.TimeoutExpired) as e:
            parts.append(f"$ {' '.join(argv)}\n({e})")
    return "\n".join(parts)


@contextlib.contextmanager
def _not_coming_or_going(state_dir: str) -> Iterator[bool]:
    """Whether no ``devcluster up``/``down`` holds the state dir's lock (held for the block when it does not)."""
    try:
        f = open(os.path.join(state_dir, ".lock"), "a")
    except OSError:
        yield False
        return
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _tail(path: str, lines: int = 3) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - 4096))
            return " | ".join(f.read().decode(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class Keeper:
    """What the thread saw and did; :meth:`look` is one look, callable without the thread (a test does)."""

    def __init__(self) -> None:
        self.done: list[str] = []
        self._dead: dict[str, int] = {}  # node -> the dead slurmd's PID, seen once
        self._silent: dict[str, float] = {}  # node -> since when it has been alive but not answering
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def look(self, state_dir: str | None = None, now: float | None = None) -> list[str]:
        """One look at the cluster in ``state_dir`` (the shared one by default); what it restarted, in words."""
        from torchhpc.devcluster import daemons, read_state

        now = time.monotonic() if now is None else now
        state = read_state(state_dir)
        if state is None:
            return []
        records = {d.name.removeprefix("slurmd-"): d for d in state.daemons if d.name.startswith("slurmd-")}
        dead = {n for n, d in records.items() if n not in state.failed and not daemons.alive(d)}
        silent: set[str] = set()
        said: list[str] = []
        if len(dead) < len(records):
            shown = _nodes(state)
            silent = {n for n, (t, _) in shown.items() if "*" in t and n in records and n not in dead | set(state.failed)}
            said += [self._undrain(state, n) for n, (t, why) in sorted(shown.items())
                     if t.startswith(("drain", "drng")) and why.startswith(UNKILLABLE) and n not in state.failed]
        due = {n for n in dead if self._dead.get(n) == records[n].pid}
        due |= {n for n in silent if now - self._silent.get(n, now) >= HUNG_S}
        self._dead = {n: records[n].pid for n in dead}
        self._silent = {n: self._silent.get(n, now) for n in silent}
        if due:
            said += self._restart(state.state_dir, sorted(due), records, dead)
        self.done += said
        return said

    def _restart(self, state_dir: str, nodes: list[str], records: dict[str, Any], dead: set[str]) -> list[str]:
        """Start again the slurmd of each of ``nodes`` (killed first where it was alive but silent), unless
        ``devcluster up``/``down`` holds the state dir or the node has since been failed on purpose."""
        from torchhpc.devcluster import daemons, read_state
        from torchhpc.devcluster.bringup import restart_slurmd

        said: list[str] = []
        with _not_coming_or_going(state_dir) as free:
            state = read_state(state_dir) if free else None
            for node in nodes:
                if state is None or node in state.failed:
                    continue
                old = records[node]
                how = "died" if node in dead else f"stopped answering for {HUNG_S:.0f} s"
                if node not in dead:
                    with contextlib.suppress(OSError):
                        os.kill(old.pid, signal.SIGKILL)
                    deadline = time.monotonic() + 10
                    while daemons.alive(old) and time.monotonic() < deadline:
                        time.sleep(0.1)
                last = _tail(old.log)  # its stdout and stderr: its log lines, and what glibc says as it aborts
                restart_slurmd(state, node)
                said.append(f"{time.strftime('%H:%M:%S')} {node}'s slurmd (PID {old.pid}) {how}: started again "
                            f"(the last lines of {old.log}: {last})")
                self._dead.pop(node, None)
                self._silent.pop(node, None)
        return said

    def _undrain(self, state: Any, node: str) -> str:
        """A node Slurm drained because a step's processes outlived UnkillableStepTimeout: what is still there
        (the evidence), then the node back in service, said."""
        left = processes_of(state, node)
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], env=state.client_env(),
                       capture_output=True, timeout=30)
        what = "; ".join(left) if left else "no process left on it"
        return f"{time.strftime('%H:%M:%S')} {node} was drained ({UNKILLABLE}): resumed; on it then: {what}"

    def start(self) -> None:
        def loop() -> None:
            while not self._stop.wait(POLL_S):
                try:
                    self.look()
                except Exception as e:  # a look that fails is tried again; the run goes on
                    self.done.append(f"{time.strftime('%H:%M:%S')} the keeper's look failed: {e!r}")
        self._thread = threading.Thread(target=loop, name="dev-cluster-keeper", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)


def pytest_sessionstart(session: pytest.Session) -> None:
    if hasattr(session.config, "workerinput"):
        return  # xdist's workers: the controller keeps the cluster
    from torchhpc.devcluster import read_state

    if read_state() is None:
        return
    keeper = Keeper()
    session.config.stash[_KEEPER] = keeper
    keeper.start()


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    keeper = session.config.stash.get(_KEEPER, None)
    if keeper is not None:
        keeper.stop()


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    keeper = config.stash.get(_KEEPER, None)
    if keeper is None or not keeper.done:
        return
    terminalreporter.section("dev cluster keeper", yellow=True)
    for line in keeper.done:
        terminalreporter.write_line(line, yellow=True)
