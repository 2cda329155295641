"""``--max-restarts`` and ``--hang-timeout`` for a local job, with no client needed.

A local job has no allocation and no second node, but it has the in-allocation supervisor's
other half: a run that ended by a cause outside the program (a hang, a network error, a lost
peer) is started again, up to ``--max-restarts`` times, and the program resumes from its own
checkpoint (``TORCHHPC_RESTART_COUNT`` and torchrun's ``TORCHELASTIC_RESTART_COUNT`` say which
attempt it is). The policy is the supervisor's (:mod:`torchhpc.supervisor.policy`): a user
exception or an out-of-memory is never restarted. Each attempt is written to the job directory's
``attempts.json``, which ``status`` and ``diagnose`` read as they do for a Slurm job.

The same loop serves a foreground run (``torchhpc run -n 4``, cli/foreground.py) and a background
one (its supervisor process, :mod:`torchhpc.supervisor.background`); the hang watch runs in a
thread of that process during each attempt, so a background job is watched with no ``wait`` running.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Optional, TypeVar, cast

from torchhpc.core.exitcodes import exit_code_for
from torchhpc.errors import JobFailed
from torchhpc.supervisor.attempts import Attempt, load_attempts, save_attempts
from torchhpc.supervisor.attempts import storm as record_storm
from torchhpc.supervisor.policy import why_not
from torchhpc.supervisor.progress import NoProgress
from torchhpc.supervisor.resume import restart_args

__all__ = ["Restarts", "classify_log"]

T = TypeVar("T")

WATCH_POLL_S = 1.0  # how often the watch thread looks at the ranks' last output


def classify_log(log_path: str, offset: int) -> tuple[str, Optional[int], str]:
    """(class, rank, error line) of what the ranks wrote to ``log_path`` (``[rankN]: `` lines) after
    ``offset``: the first rank, in the log's order, whose lines show a cause (diagnose.classify.first_cause)."""
    from torchhpc.diagnose.classify import first_cause
    from torchhpc.jobdir.logs import parse_line

    try:
        with open(log_path, errors="replace") as f:
            f.seek(offset)
            lines = f.read().splitlines()
    except OSError:
        return "unknown", None, ""
    by_rank: dict[int, list[str]] = {}  # dicts keep the order of each rank's first line
    for line in lines:
        ln = parse_line(line, "local")
        if ln.rank is not None:
            by_rank.setdefault(ln.rank, []).append(ln.text)
    return first_cause(by_rank.items())


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


class Restarts:
    """The attempts of one local job: ``Restarts(...).run(attempt)`` calls ``attempt(count)`` until it
    returns, or fails by a cause the policy does not restart, or ``max_restarts`` restarts are spent
    (then the last :class:`JobFailed` is raised). ``fired`` tells whether the hang watch ended the
    last attempt; ``klass`` is the class the job ended with (``no-progress`` after a restart storm,
    see :mod:`torchhpc.supervisor.progress`), and :meth:`exit_code` its class-coded exit status.

    ``watch(act)`` makes the hang watch for one attempt (None: no watch); ``act`` is called once it
    has named a hang, and stops the attempt with SIGTERM to this process, as ``torchhpc cancel``
    does. A run interrupted otherwise (Ctrl-C, ``cancel``) is never restarted.
    """

    def __init__(self, *, max_restarts: int, job_dir: str, log_path: str,
                 watch: Optional[Callable[[Callable[[str], None]], Any]] = None,
                 say: Callable[[str], None] = lambda text: print(f"torchhpc: {text}", file=sys.stderr, flush=True),
                 max_no_progress: int = 3, checkpoint_dir: Optional[str] = None, on_restart_append: str = "") -> None:
        self.max_restarts, self.job_dir, self.log_path = max_restarts, job_dir, log_path
        self.watch, self.say = watch, say
        self.fired = False
        self.at_exit = ""  # every rank's program had ended and the watch stopped the rest: who hung at exit
        self.klass: Optional[str] = None
        self.on_restart_append = on_restart_append
        self.progress = NoProgress(max_no_progress if max_restarts else 0, job_dir, checkpoint_dir)

    def extra_args(self, count: int) -> list[str]:
        """What attempt ``count`` adds to the program (``--on-restart-append``, supervisor/resume.py)."""
        return restart_args(self.on_restart_append, count, say=self.say)

    def exit_code(self, fallback: int) -> int:
        """The class-coded exit status (core/exitcodes.py) of the job's end; ``fallback`` when no class is known."""
        return exit_code_for(self.klass) if self.klass else fallback

    def run(self, attempt: Callable[[int], T]) -> T:
        history = load_attempts(self.job_dir) if self.max_restarts else []
        count = len(history)
        while True:
            offset = _size(self.log_path)
            row = Attempt(attempt=count, nodes=["localhost"], started=time.time())
            fired, done, finishing = threading.Event(), threading.Event(), threading.Event()
            acting = (f"stop this attempt (--max-restarts {self.max_restarts}: the supervisor decides whether "
                      "it restarts)") if self.max_restarts else ""
            from torchhpc.diagnose import exits

            exits.clear(self.job_dir)  # the marks of the ranks' return (boot/sitecustomize.py) are per attempt
            watcher = _start_watch(self.watch, fired, done, acting, finishing) if self.watch is not None else None
            try:
                result = attempt(count)
            except JobFailed as e:
                done.set()
                if finishing.is_set():  # every rank's program had ended; the watch stopped what hung at exit
                    if watcher is not None:
                        watcher.join(timeout=10)
                    self.at_exit = (watcher.at_exit if watcher is not None else "") or "a rank hung at exit"
                    row.checkpoint_step = self.progress.after(None)
                    self._record(history, row, None, 0, None, self.at_exit)
                    self.klass = None
                    return cast(T, 0)
                self.fired = fired.is_set()
                if e.message.startswith("interrupted") and not self.fired:
                    raise  # Ctrl-C or `torchhpc cancel`: the user's word is final
                klass, rank, error = ("hang", None, "") if self.fired else classify_log(self.log_path, offset)
                if self.fired:
                    row.fault, row.found_by = time.time(), "hang-watch"
                self.klass = klass
                row.checkpoint_step = self.progress.after(klass)
                self._record(history, row, klass, e.exit_code, rank, error)
                if not self._again(klass, count):
                    raise
                storm = self.progress.why_stop()
                if storm:
                    self.say(storm)
                    self.klass = "no-progress"
                    record_storm(self.job_dir, history, storm)
                    raise JobFailed(storm, "see each attempt: torchhpc status JOB; the program never saved a newer "
                                    "checkpoint (--checkpoint-dir DIR says where it saves)", e.exit_code) from None
                self.say(f"attempt {count} ended: {klass}" + (f" (rank {rank})" if rank is not None else "")
                         + f"; restart {count + 1} of {self.max_restarts} (TORCHHPC_RESTART_COUNT={count + 1})")
                count += 1
                continue
            finally:
                done.set()
                if watcher is not None:
                    watcher.join(timeout=10)
            row.checkpoint_step = self.progress.after(None)
            self._record(history, row, None, 0, None, "")
            self.klass = None
            return result

    def _record(self, history: list[dict[str, Any]], row: Attempt, klass: Optional[str], code: int,
                rank: Optional[int], error: str) -> None:
        if not self.max_restarts:
            return  # one attempt: the record and the verdict say all (no attempts.json, as before)
        row.ended, row.klass, row.exit_code, row.rank, row.detail = time.time(), klass, code, rank, error[:300]
        history.append(row.to_json())
        save_attempts(self.job_dir, history)

    def _again(self, klass: str, count: int) -> bool:
        if not self.max_restarts:
            return False
        why = why_not(klass, count, self.max_restarts)
        if why:
            self.say(why)
        return not why


def _start_watch(make: Callable[[Callable[[str], None]], Any], fired: threading.Event,
                 done: threading.Event, acting: str = "", finishing: Optional[threading.Event] = None
                 ) -> Optional[_WatchThread]:
    def stop(what: str) -> None:  # the same SIGTERM `torchhpc cancel` sends; the runner stops the ranks
        if not done.is_set():
            (finishing if what == "finish" and finishing is not None else fired).set()
            os.kill(os.getpid(), signal.SIGTERM)

    w = make(stop)
    if w is None:
        return None
    if acting:  # with restarts the watch stops one attempt, not the job ("cancel the job" was said, then a restart)
        w.acting = acting
    out = _WatchThread()
    out.thread = threading.Thread(target=_watch_loop, args=(w, done, out), daemon=True, name="hang-watch")
    out.thread.start()
    return out


class _WatchThread:
    """The watch's thread, and the hang-at-exit lines it said (read once the attempt ended)."""

    def __init__(self) -> None:
        self.thread: Optional[threading.Thread] = None
        self.at_exit = ""

    def join(self, timeout: Optional[float] = None) -> None:
        if self.thread is not None:
            self.thread.join(timeout)


def _watch_loop(watch: Any, done: threading.Event, out: Optional[_WatchThread] = None) -> None:
    while not done.wait(WATCH_POLL_S):
        try:
            verdict = watch.check("RUNNING")
            if verdict is not None:
                if out is not None and getattr(verdict, "at_exit", None):
                    out.at_exit = "; ".join(verdict.at_exit)
                return  # it fired once and stopped the attempt
        except Exception as e:  # the watch is a courtesy: the run goes on without it
            print(f"torchhpc: hang: the watch stopped: {e}", file=sys.stderr, flush=True)
            return
