"""A job's rank processes in the foreground: N processes, their output relayed line by line, one failure stops all.

The local scheduler's engine (:mod:`torchhpc.schedulers.local.local` builds each
rank's environment; this module only manages processes). Every child runs in
its own session (``start_new_session``) so ``killpg`` reaches what it forked,
as a Slurm step's processes end with the step. Like :mod:`torchhpc.core.proc`
it is stdlib only: the parent never imports torch.
"""

from __future__ import annotations

import collections
import contextlib
import os
import queue
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import IO, Any, Optional

from torchhpc.core.shell import join
from torchhpc.core.units import plural
from torchhpc.errors import CommandNotFound, JobFailed

__all__ = ["PREFIX", "RankProcesses", "describe_exit", "exit_status", "killpg", "stop_group", "stopped_ranks",
           "stopped_words"]

PREFIX = "[rank{rank}]: "
# A torchhpc error as a script ends with it (thd.init's hook, a tool inside the job): every rank of a
# node says the same thing when the node's geometry is wrong, and once on the screen is enough.
_ONE_LINE_ERROR = re.compile(r"^(Error|HINT): ")


def describe_exit(rank: int, returncode: int) -> str:
    """``rank 1 exited with code 3`` / ``rank 2 was killed by signal 9 (SIGKILL)``."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "unknown signal"
        return f"rank {rank} was killed by signal {-returncode} ({name})"
    return f"rank {rank} exited with code {returncode}"


def stopped_words(stopped: list[int], world: int) -> str:
    """What a failed run did to its other ranks, in the words its reason keeps (:func:`stopped_ranks`
    reads them back: ``diagnose`` counts as consequences only the ranks named here)."""
    others = world - 1
    if stopped and len(stopped) == others:
        return f"stopped the other {others} ranks" if others > 1 else "stopped the other rank"
    if stopped:
        return f"stopped {plural(len(stopped), 'rank')} {','.join(map(str, sorted(stopped)))}, still running"
    return "no other rank was running"


_FIRST = re.compile(r"^rank (\d+) (?:exited|was killed)")
_STOPPED = re.compile(r"; (?:stopped the other (?:rank|\d+ ranks)|stopped ranks? ([\d,]+), still running|(no other rank was running))$")


def stopped_ranks(reason: str, world: int) -> Optional[set[int]]:
    """The ranks a failed run's reason says it stopped; None where the reason does not say (an
    older record, an interrupted run): then the caller assumes every other rank."""
    first, said = _FIRST.match(reason), _STOPPED.search(reason)
    if first is None or said is None:
        return None
    if said.group(2):
        return set()
    if said.group(1):
        return {int(r) for r in said.group(1).split(",")}
    return set(range(world)) - {int(first.group(1))}


def exit_status(returncode: int) -> int:
    """The shell's convention: a code as is, a signal as 128 + its number."""
    return 128 - returncode if returncode < 0 else returncode


class _Stop(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class RankProcesses:
    """One foreground run: the processes, their output pumps, their waiters, and teardown.

    A waiter thread per rank blocks in ``wait()`` and queues ``(rank, code)`` the
    moment the rank ends, so the first failure is the first to *happen*, not
    the lowest rank found by a later poll (a rank that dies takes its peers'
    connections down with it a few milliseconds later).
    """

    TAIL = 20  # last lines of each rank: a hidden rank's are shown when it fails, all say what the HINT points at

    def __init__(
        self,
        argv: list[str],
        envs: list[dict[str, str]],
        *,
        stdout: IO[str],
        stderr: IO[str],
        rank0_only: bool,
        grace: float,
        poll: float,
        log: Optional[IO[str]] = None,
    ) -> None:
        self.argv = argv
        self.log = log  # every rank's lines, also those rank0_only hides: what the verdict and the hang watch read
        self.envs = envs
        self.out = stdout
        self.err = stderr
        self.rank0_only = rank0_only
        self.grace = grace
        self.poll = poll
        self.procs: list[subprocess.Popen[bytes]] = []
        self.codes: list[Optional[int]] = [None] * len(envs)
        self.ended: queue.Queue[tuple[int, int]] = queue.Queue()
        self.threads: list[threading.Thread] = []
        self.lock = threading.Lock()
        self.tails: list[collections.deque[str]] = [collections.deque(maxlen=self.TAIL) for _ in envs]
        self.signal: int | None = None
        self.errors_shown: dict[str, int] = {}  # an Error:/HINT: line shown, and the rank that showed it

    # -- threads --------------------------------------------------------
    def _pump(self, rank: int, pipe: IO[bytes], stream: IO[str]) -> None:
        prefix = PREFIX.format(rank=rank)
        show = rank == 0 or not self.rank0_only
        for raw in _pieces(pipe):
            end = "\r" if raw.endswith(b"\r") else "\n"
            text = raw.decode("utf-8", "replace").rstrip("\r\n")
            if not text and end == "\r":
                continue  # the \r a progress bar starts its redraw with
            # torch prefixes a rank's own error lines ([rank2]: Traceback...): not twice.
            line = (text if text.startswith(prefix.rstrip()) else prefix + text) + end
            if end == "\n":
                self.tails[rank].append(line)  # the failure's HINT says what the rank left: a traceback, an error
            if self.log is not None and end == "\n":
                with self.lock:
                    try:
                        _write(self.log, line)
                    except Exception:  # a full disk must not stop the run: the terminal still shows it
                        self.log = None
            if not show:
                continue
            with self.lock:
                if _ONE_LINE_ERROR.match(text) and self.errors_shown.setdefault(text, rank) != rank:
                    continue  # another rank showed this very line: the HINT names that rank
                try:
                    _write(stream, line)
                except Exception:  # a closed or broken stream must not stop the draining
                    show = False  # keep reading so the rank never blocks on a full pipe
        pipe.close()

    def _wait(self, rank: int, proc: subprocess.Popen[bytes]) -> None:
        rc = proc.wait()
        self.codes[rank] = rc
        self.ended.put((rank, rc))

    def _thread(self, target: object, *args: object) -> None:
        t = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        t.start()
        self.threads.append(t)

    # -- lifecycle ------------------------------------------------------
    def run(self) -> int:
        handlers = self._install_handlers()
        failed: tuple[int, int] | None = None
        stopped: list[int] = []
        try:
            try:
                self._start()
                failed = self._watch()
            except _Stop as stop:
                n = len(self._teardown())
                name = signal.Signals(stop.signum).name
                raise JobFailed(
                    f"interrupted by {name}; stopped " + (f"{n} running ranks of {len(self.envs)}" if n > 1 else
                                                          f"{n} running rank of {len(self.envs)}"),
                    returncode=128 + stop.signum,
                ) from None
            if failed is not None:
                stopped = self._teardown()
        finally:
            self._teardown()
            self._sweep()
            self._restore_handlers(handlers)
            # A process that left the rank's group (setsid) may hold a pipe open: wait 2 s in all.
            deadline = time.monotonic() + 2.0
            for t in self.threads:
                t.join(timeout=max(0.0, deadline - time.monotonic()))
        if failed is None:
            return 0
        rank, rc = failed
        self._show_tail(rank)
        raise JobFailed(f"{describe_exit(rank, rc)}; {stopped_words(stopped, len(self.envs))}",
                        hint=self._failure_hint(rank), returncode=exit_status(rc))

    def _failure_hint(self, rank: int) -> str:
        """Point at what the failed rank really left above, never at a traceback that is not there
        (a torchhpc tool inside the job ends with ``Error: ...`` and ``HINT: ...``, no traceback)."""
        tail = "".join(self.tails[rank])
        prefix = PREFIX.format(rank=rank)
        said = next((ln[len(prefix):].rstrip("\n") for ln in self.tails[rank] if _ONE_LINE_ERROR.match(ln[len(prefix):])), "")
        where = f"above, prefixed [rank{self.errors_shown.get(said, rank)}]:"
        if "Traceback (most recent call last)" in tail or re.search(r"^\[rank\d+\]: (\w+\.)*\w+(Error|Exception): ", tail, re.M):
            return f"look for its traceback {where}"
        if re.search(r"^\[rank\d+\]: (Error|HINT): ", tail, re.M):
            return f"its error and HINT are {where}"
        if tail:
            return f"its last lines are {where}"
        return "it printed nothing: run the program alone, or add prints to see how far it gets"

    def _start(self) -> None:
        for rank, env in enumerate(self.envs):
            if self.signal is not None:
                raise _Stop(self.signal)
            try:
                proc = subprocess.Popen(
                    self.argv,
                    env=env,
                    stdin=None if rank == 0 else subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,  # a group per rank: killpg reaches its children too
                )
            except FileNotFoundError:
                raise CommandNotFound(
                    self.argv, "check the program name and PATH (or give a script ending in .py)"
                ) from None
            except OSError as e:
                raise JobFailed(f"cannot start rank {rank}: `{join(self.argv)}`: {e.strerror}") from None
            self.procs.append(proc)
            self._thread(self._pump, rank, proc.stdout, self.out)
            self._thread(self._pump, rank, proc.stderr, self.err)
            self._thread(self._wait, rank, proc)

    def _watch(self) -> tuple[int, int] | None:
        """Wait for every rank; the first non-zero exit ends the job."""
        remaining = len(self.procs)
        while remaining:
            if self.signal is not None:
                raise _Stop(self.signal)
            try:
                rank, rc = self.ended.get(timeout=self.poll)
            except queue.Empty:
                continue
            remaining -= 1
            if rc != 0:
                return rank, rc
        return None

    def _running(self) -> list[int]:
        return [r for r in range(len(self.procs)) if self.codes[r] is None]

    def _teardown(self) -> list[int]:
        """SIGTERM every running rank's group, SIGKILL after the grace period; the ranks that were running."""
        alive = self._running()
        for sig in (signal.SIGTERM, signal.SIGKILL):  # SIGKILL: what the grace period did not end
            for r in self._running():
                killpg(self.procs[r].pid, sig)
            deadline = time.monotonic() + self.grace
            while self._running() and time.monotonic() < deadline:
                time.sleep(self.poll)
        return alive

    def _sweep(self) -> None:
        """Kill what a rank left behind in its group: a job's processes end with the job."""
        for p in self.procs:
            killpg(p.pid, signal.SIGKILL)

    def _show_tail(self, rank: int) -> None:
        if not self.rank0_only or rank == 0 or not self.tails[rank]:
            return
        with self.lock, contextlib.suppress(BrokenPipeError, ValueError):
            self.err.write("".join(self.tails[rank]))
            self.err.flush()

    # -- signals --------------------------------------------------------
    def _install_handlers(self) -> dict[int, object]:
        """Ctrl-C / SIGTERM / SIGHUP stop every rank: they are in their own sessions, so the
        terminal's SIGINT does not reach them. Only the main thread may set handlers. A signal this
        process was started with ignored stays ignored: ``nohup torchhpc run ... &`` must outlive the
        terminal (SIGHUP), and a script's ``&`` job must not stop on the script's Ctrl-C (SIGINT)."""
        if threading.current_thread() is not threading.main_thread():
            return {}

        def on_signal(signum: int, frame: object) -> None:
            self.signal = signum

        old: dict[int, object] = {}
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) == signal.SIG_IGN:
                continue
            old[sig] = signal.signal(sig, on_signal)
        return old

    @staticmethod
    def _restore_handlers(old: dict[int, object]) -> None:
        for sig, handler in old.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]


def _pieces(pipe: IO[bytes]) -> Iterator[bytes]:
    """A rank's output in lines, and in the pieces a progress bar ends with ``\\r`` (tqdm redraws its
    line that way): each redraw reaches the terminal (which overwrites it in place) and the log
    at once, where ``torchhpc top`` reads the bar, instead of all of them when a newline comes."""
    fd = pipe.fileno()
    rest = b""
    while True:
        data = os.read(fd, 65536)
        if not data:
            break
        rest += data
        start = 0
        for m in _ENDS.finditer(rest):
            yield rest[start:m.end()]
            start = m.end()
        rest = rest[start:]
    if rest:
        yield rest


_ENDS = re.compile(rb"\r\n|\n|\r(?!$)")  # a \r last in the buffer waits: a \n may follow


def _write(stream: IO[str], line: str) -> None:
    try:
        stream.write(line)
    except UnicodeEncodeError:  # e.g. PYTHONIOENCODING=ascii: escape rather than lose the line
        enc = getattr(stream, "encoding", None) or "ascii"
        stream.write(line.encode(enc, "backslashreplace").decode(enc))
    stream.flush()


def killpg(pgid: int, sig: int) -> None:
    """``sig`` to the process group ``pgid``; one already gone is no error."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def stop_group(proc: subprocess.Popen[Any], grace: float = 5.0) -> int:
    """End a process that leads its own session: TERM to the group (KILL at once without ``grace``),
    KILL to what is left after ``grace`` seconds. Returns its exit status."""
    killpg(proc.pid, signal.SIGTERM if grace else signal.SIGKILL)
    try:
        return proc.wait(timeout=max(grace, 0.1))
    except subprocess.TimeoutExpired:
        killpg(proc.pid, signal.SIGKILL)
        return proc.wait()

