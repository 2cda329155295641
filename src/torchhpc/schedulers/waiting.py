"""Waiting for a job's end with a light touch on the controller.

A client that waits (``--wait``, ``wait``, ``Handle.wait()``, ``FunctionJob.result()``, the hang
watch through them) watches the job's end marker (:mod:`~torchhpc.jobdir.endmark`) with a
``stat`` every :data:`STAT_POLL` seconds, which costs the controller nothing, and asks the
scheduler (``scontrol``, ``qstat``) only

- at once, then after 1, 2, 4, 8 and 16 s, then every :data:`CAP` s: at most 2 questions a
  minute after the first minute, for a job that ends without a marker (SIGKILL, a node lost,
  a script submitted by hand);
- when a marker appears, to confirm it: a terminal answer is returned as it is (with the marker's
  exit status where it has none). COMPLETING or RUNNING (the batch shell is past its last line; the
  controller hears of its exit a moment, on a loaded node seconds, later) is the end in the
  marker's words (its state and exit status, the controller's other fields). PENDING, a requeue
  state or a higher restart count than the marker's means the marker is an earlier run's (a job
  requeued by the scheduler), which is then ignored until the next run writes its own.

Where the job's directory is not visible here (another filesystem; an array, whose tasks each
have their own), it polls as before: every ``poll`` seconds after a quick start. A scheduler
that asks no controller (local: its status is a file) keeps that quick poll too.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Generic, Optional, Protocol, TypeVar

from torchhpc.jobdir.endmark import EndMark, end_path, read_end

__all__ = ["CAP", "FIRST", "STAT_POLL", "EndWatch", "settled"]


class _Status(Protocol):
    """What the watch reads of a :class:`~torchhpc.schedulers.api.JobStatus` (a dataclass; not imported:
    api imports this module)."""

    state: str
    exit_code: Optional[int]

    @property
    def terminal(self) -> bool: ...


S = TypeVar("S", bound=_Status)

STAT_POLL = 0.1  # seconds between two looks at the marker: the return latency's main part
FIRST = 1.0  # the first pause between two questions to the controller (doubled up to CAP)
CAP = 30.0  # the longest pause: 2 questions a minute
# The controller's answers that say a marker belongs to an earlier run of a requeued job.
REQUEUED = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "REQUEUE", "RESV_DEL_HOLD"})


class EndWatch(Generic[S]):
    """One job's wait: :meth:`step` says the latest status (asking the controller only when due),
    :meth:`pause` how long to sleep before the next step, :attr:`ended` whether it is over."""

    def __init__(
        self,
        status: Callable[[], S],
        end_dir: Optional[str],
        *,
        poll: float = 1.0,
        controller: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._status, self.end_dir, self._clock = status, end_dir, clock
        self._light = bool(end_dir) and controller  # back off: the marker says the end
        self._interval = FIRST if self._light else min(poll, 0.25)
        self._cap = CAP if self._light else poll
        self._next = clock()
        self._seen: tuple[int, int, int] | None = None  # the marker file's identity last read
        self._ignored: set[tuple[int, int, int]] = set()
        self._mark: Optional[EndMark] = None  # a marker being confirmed
        self.last: Optional[S] = None
        self.ended = False
        self.calls = 0  # questions asked (tests and benchmarks count them)

    def _look(self) -> None:
        """A new marker, not yet judged: ask the controller now."""
        if not self.end_dir or self._mark is not None:
            return
        try:
            st = os.stat(end_path(self.end_dir))
        except OSError:
            return
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if key == self._seen or key in self._ignored:
            return
        self._seen = key
        mark = read_end(self.end_dir)
        if mark is not None and mark.key not in self._ignored:
            self._mark, self._next = mark, self._clock()

    def step(self) -> tuple[S | None, bool]:
        """(the latest status, whether it is a fresh answer of the controller)."""
        self._look()
        now = self._clock()
        if self.ended or now < self._next:
            return self.last, False
        self.calls += 1
        try:
            st = self._status()
        except Exception:
            self._next = now + self._interval  # a failed question waits its turn too: no tight loop
            raise
        self.last = st
        mark = self._mark
        if st.terminal:
            self.ended = True
            if mark is not None and st.exit_code is None and mark.exit_code is not None:
                self.last = replace(st, exit_code=mark.exit_code)  # type: ignore[type-var]
        elif mark is not None and _earlier_run(st, mark):
            self._ignored.add(mark.key)  # an earlier run's: wait for the next run's marker
            self._mark = None
            self._next = now + self._interval
        elif mark is not None:
            # The same run, its batch shell past its last line (COMPLETING, or RUNNING until the
            # controller hears of the exit, seconds on a loaded node): the end, in the marker's words.
            self.ended = True
            self.last = _in_marks_words(st, mark)
        else:
            self._next = now + self._interval
            self._interval = min(self._interval * 2, self._cap)
        return self.last, True

    def pause(self) -> float:
        """Seconds to sleep before the next :meth:`step`."""
        wait = max(0.0, self._next - self._clock())
        return min(wait, STAT_POLL) if self.end_dir else wait


def settled(st: S, end_dir: Optional[str]) -> S:
    """``st`` in the end marker's words when the controller still says RUNNING or COMPLETING but this
    run's batch shell has ended (the rule :class:`EndWatch` applies): ``status`` right after a
    ``wait`` then says what the wait said, not COMPLETING. A marker of an earlier run is not this
    run's end."""
    if st.state not in ("RUNNING", "COMPLETING") or not end_dir:
        return st
    mark = read_end(end_dir)
    return st if mark is None or _earlier_run(st, mark) else _in_marks_words(st, mark)


def _earlier_run(st: _Status, mark: EndMark) -> bool:
    """Whether ``mark`` is an earlier run's end: the job went back to the queue, or has restarted since."""
    return st.state in REQUEUED or getattr(st, "restarts", 0) > mark.restart


def _in_marks_words(st: S, mark: EndMark) -> S:
    """The controller's other fields, the marker's state and exit status."""
    return replace(st, state=mark.state, exit_code=mark.exit_code)  # type: ignore[type-var]

