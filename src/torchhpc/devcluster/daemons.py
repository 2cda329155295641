"""Starting and stopping the dev cluster's daemons by recorded PID.

Daemons are long-lived, so they are the one place that uses ``subprocess.Popen``
directly instead of :class:`torchhpc.core.proc.Runner` (which runs commands to
completion). Each record keeps the PID *and* the process start time from
/proc, so ``down`` never signals a process that merely reused a PID.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import asdict, dataclass

from torchhpc.errors import DevClusterError

__all__ = ["Daemon", "alive", "kill_pids", "listening", "proc_stat", "start", "stop", "wait_for"]


@dataclass(frozen=True)
class Daemon:
    """One process we started: what it is, where it runs, and how to recognise it."""

    name: str
    pid: int
    start_time: int
    netns: str | None
    log: str

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, object]) -> Daemon:
        return cls(
            name=str(d["name"]),
            pid=int(d["pid"]),  # type: ignore[call-overload]
            start_time=int(d["start_time"]),  # type: ignore[call-overload]
            netns=None if d.get("netns") is None else str(d["netns"]),
            log=str(d.get("log", "")),
        )


def proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks) of a PID, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    # The command name may contain spaces and parentheses: split after the last ')'.
    rest = text[text.rindex(")") + 2 :].split()
    return rest[0], int(rest[19])


def alive(d: Daemon) -> bool:
    """True while the recorded process runs. A zombie counts as stopped: PID 1
    reaps daemons started with a new session slowly (~2 s here)."""
    st = proc_stat(d.pid)
    return st is not None and st[1] == d.start_time and st[0] not in ("Z", "X")


def start(
    name: str,
    argv: Sequence[str],
    log: str,
    netns: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Daemon:
    """Start one daemon in its own session, output appended to ``log``, in the log's folder: a daemon that dumps
    core (slurmd did once, 2026-12-04) leaves it beside its log, for the post-mortem until the next ``up``,
    not in the checkout ``up`` was typed in."""
    try:
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=dict(env) if env is not None else None,
                close_fds=True,
                cwd=os.path.dirname(os.path.abspath(log)),
            )
    except OSError as e:
        raise DevClusterError(
            f"cannot start {name} ({argv[0]}): {e}", "check that the Slurm/munge packages are installed"
        ) from None
    st = proc_stat(proc.pid)
    # The Popen object is dropped on purpose: the daemon outlives this process
    # and is identified later by PID + start time only.
    return Daemon(name=name, pid=proc.pid, start_time=st[1] if st else 0, netns=netns, log=log)


def listening(pid: int, port: int) -> bool:
    """True when the network namespace of ``pid`` has a TCP socket listening on ``port``.

    Reads /proc/PID/net/tcp{,6}, which show the sockets of that process's
    network namespace: no need to enter it, and no race with log lines that
    are written before the daemon actually listens.
    """
    want = f":{port:04X}"
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}") as f:
                next(f, None)
                for line in f:
                    fields = line.split()
                    # local_address is IP:PORT in hex; state 0A is LISTEN.
                    if len(fields) > 3 and fields[1].endswith(want) and fields[3] == "0A":
                        return True
        except OSError:
            continue
    return False


def _signal(pid: int, sig: signal.Signals) -> None:
    with suppress(ProcessLookupError):
        os.kill(pid, sig)


def _reap(pid: int) -> None:
    """Collect our own child's exit status so it does not linger as a zombie."""
    with suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def stop(daemons: Sequence[Daemon], timeout: float = 10.0) -> list[str]:
    """SIGTERM every recorded daemon still running, SIGKILL what is left after ``timeout``.

    Returns the names of the daemons that were running. Only recorded PIDs
    whose start time still matches are signalled.
    """
    running = [d for d in daemons if alive(d)]
    for d in running:
        _signal(d.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for d in running:
            _reap(d.pid)
        if not any(alive(d) for d in running):
            break
        time.sleep(0.05)
    for d in running:
        if alive(d):
            _signal(d.pid, signal.SIGKILL)
            _reap(d.pid)
    return [d.name for d in running]


def kill_pids(pids: Sequence[int], timeout: float = 5.0,
              signals: Sequence[signal.Signals] = (signal.SIGTERM, signal.SIGKILL)) -> None:
    """SIGTERM then SIGKILL (``signals``) a set of PIDs found inside the cluster's namespaces."""
    for sig in signals:
        for pid in pids:
            _signal(pid, sig)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = [proc_stat(pid) for pid in pids]
            if all(st is None or st[0] in ("Z", "X") for st in states):
                return
            time.sleep(0.05)


def wait_for(
    what: str,
    check: Callable[[], bool],
    timeout: float,
    daemons: Sequence[Daemon] = (),
    interval: float = 0.05,
) -> None:
    """Poll ``check`` until true; fail early (naming the log) if a daemon died meanwhile."""
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return
        for d in daemons:
            if not alive(d):
                raise DevClusterError(
                    f"{d.name} (pid {d.pid}) exited while waiting for {what}",
                    f"see its log {d.log}",
                )
        if time.monotonic() > deadline:
            logs = ", ".join(d.log for d in daemons) or "the logs in the state dir"
            raise DevClusterError(f"timed out after {timeout:.0f} s waiting for {what}", f"see {logs}")
        time.sleep(interval)
