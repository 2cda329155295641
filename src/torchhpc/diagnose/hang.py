"""Hang detection with no change to the user's code: find the quiet ranks, read their stacks, name the culprit.

A hung distributed job looks like a healthy one to the scheduler: every process is alive. What
tells them apart is progress. While ``run --wait --hang-timeout S`` (or ``wait --hang-timeout S``)
follows a job:

1. **quiet**: no rank has written a line to its own log for S seconds (the per-rank files'
   last-write times, which torchhpc already keeps);
2. **probe** every node (``srun --overlap`` once per node for Slurm; directly for the local
   scheduler): on each node, :mod:`torchhpc.diagnose.probe` finds the job's rank processes in
   ``/proc`` (their environment names the job and the rank), samples their CPU time twice, and
   dumps each one's Python stack with py-spy where it is installed. A rank that used CPU is computing, not hung:
   then nothing is done and the watch goes on;
3. **name the culprit** (:func:`~torchhpc.diagnose.hang_verdict.culprit`): the rank whose stack is not
   in a collective while the others wait in one, with its innermost user frame (file:line);
4. **ask the Flight Recorder** (:func:`~torchhpc.diagnose.hang_verdict.with_flight`): every rank dumps its
   recorded collectives into ``<job dir>/fr/`` (boot/sitecustomize.py), and :mod:`torchhpc.diagnose.flight`
   names the rank that never entered collective #N, a mismatched op or size, or a rank that left the group;
5. **act** as the user chose (``--on-hang cancel``, the default, or ``requeue``), after saving
   the diagnosis in the job directory (``hang.json``), where ``torchhpc diagnose`` reads it.

Without py-spy the stacks cannot be read from outside: the verdict says so and names the quiet
ranks only (``pip install py-spy``, or the ``diagnose`` extra).

This module is the watch (when to look, what to do); what the stacks say is
:mod:`torchhpc.diagnose.hang_verdict`'s.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from contextlib import suppress
from typing import TYPE_CHECKING, Optional

from torchhpc.core.handle import Handle
from torchhpc.core.proc import Runner
from torchhpc.core.units import plural
from torchhpc.diagnose import exits
from torchhpc.diagnose.hang_verdict import HangVerdict, culprit, exiting, in_collective, render, starting, with_flight
from torchhpc.diagnose.probe import BUSY_CPU_S, EXITED, RankStack, ask_nodes, one_per_process, probe
from torchhpc.errors import TorchHPCError
from torchhpc.jobdir.layout import HANG, read_json

if TYPE_CHECKING:
    from torchhpc.schedulers.api import Scheduler

__all__ = [
    "HangWatch",
    "probe_job",
    "quiet_for",
    "watch_job",
]

# How much longer than --hang-timeout an exit may stay quiet before the watch looks at it as a hang: the
# destroy guard ends a rank stuck in destroy_process_group after 60 s (TORCHHPC_DESTROY_TIMEOUT), with its stack
EXIT_GRACE_S = 90.0

# torch's default process-group timeouts: a collective stuck longer ends in an error, not a hang
PG_TIMEOUT_S = {"nccl": 600.0, "gloo": 1800.0}


def pg_timeout_note(hang_timeout: Optional[float], gpus: int) -> str:
    """One line when ``--hang-timeout`` is longer than the process group's own default timeout (NCCL
    10 min, gloo 30 min): the group then ends a stuck collective with an error before the watch looks.
    torchhpc says so rather than raise the group's timeout: a program's own ``timeout=`` must stay its own."""
    backend = "nccl" if gpus else "gloo"
    limit = PG_TIMEOUT_S[backend]
    if not hang_timeout or hang_timeout <= limit:
        return ""
    return (f"--hang-timeout {hang_timeout:g} is longer than {backend.upper() if gpus else backend}'s default "
            f"process-group timeout ({limit:g} s): a stuck collective fails with a timeout error first, and "
            "its Flight Recorder dump names it (pass init_process_group(timeout=...) to let the watch see the hang)")


def quiet_for(ranks_dir: str, now: float, output: str = "") -> Optional[float]:
    """Seconds since any rank last wrote to its log (None: no rank file yet).

    Without per-rank files (the local scheduler's one combined log), the ``output`` file's.
    """
    from torchhpc.jobdir.logs import last_writes

    times = [t for t, _node in last_writes(ranks_dir).values()] if os.path.isdir(ranks_dir) else []
    if not times and output:
        with suppress(OSError):
            times = [os.stat(output).st_mtime]
    return max(0.0, now - max(times)) if times else None


def save(job_dir: str, v: HangVerdict, quiet_s: float) -> str:
    path = os.path.join(job_dir, HANG)
    with open(path, "w") as f:
        json.dump({"quiet_s": quiet_s, **v.to_json()}, f, indent=1)
    return path


def load(job_dir: str) -> Optional[dict[str, object]]:
    d = read_json(os.path.join(job_dir, HANG))
    return d if isinstance(d, dict) else None


def probe_argv(match: Mapping[str, str]) -> list[str]:
    """The probe as one node runs it: this interpreter (torchhpc is installed beside it), the job's ``match``."""
    return [sys.executable, "-m", "torchhpc.diagnose.probe", *(f"{k}={v}" for k, v in match.items())]


def probe_job(
    match: Mapping[str, str], argv: Optional[list[str]], runner: Optional[Runner] = None,
    notes: Optional[list[str]] = None,
) -> list[RankStack]:
    """Every node's probe for one job: ``argv`` (the scheduler's command that runs :func:`probe_argv` once
    per node, e.g. ``srun --overlap``), or, when it is None, here (a local job's ranks are this machine's).

    ``match``: the environment items that mark the job's rank processes. ``runner`` is the scheduler's
    own command runner (its environment names the cluster).
    """
    if argv is None:
        return probe(match, "localhost")
    found, said = ask_nodes(runner or Runner(), argv, 120, empty_fails=True)
    if notes is not None:
        notes.extend(ln if ln.startswith("torchhpc: hang:") else f"torchhpc: hang: probe: {ln}" for ln in said)
    for d in found:
        d["frames"] = tuple(tuple(f) for f in d.get("frames", ()))
    return one_per_process(found, RankStack)


class HangWatch:
    """Called on every poll of a running job: after ``timeout`` quiet seconds, probe, judge, act once.

    ``match`` and ``node_argv`` are :func:`probe_job`'s (``node_argv`` is asked when probing: a pending
    job's node count is not yet known).
    """

    def __init__(self, match: Mapping[str, str], timeout: float, on_hang: str, ranks_dir: str, job_dir: str,
                 node_argv: Callable[[], Optional[list[str]]], act: Callable[[str], None], say: Callable[[str], None],
                 runner: Optional[Runner] = None, output: str = "", acting: str = "") -> None:
        self.match, self.timeout, self.on_hang = match, timeout, on_hang
        self.acting = acting  # what the watch says it does once it fires ("" : "<on_hang> the job")
        self.ranks_dir, self.job_dir, self.node_argv = ranks_dir, job_dir, node_argv
        self.act, self.say, self.runner, self.output = act, say, runner, output
        self.fired, self.quiet = False, 0.0
        self.finished = False  # it fired because every rank's program had ended (a hang at exit, no failure)
        self._next_probe = 0.0
        self._said_ending = False

    def check(self, state: str, now: Optional[float] = None, started: Optional[float] = None,
              timeout: Optional[float] = None) -> Optional[HangVerdict]:
        """``started``: an attempt's start (the supervisor's): it is quiet since then at most, and
        ``timeout`` replaces the watch's own while it starts."""
        if self.fired or state != "RUNNING":
            return None
        now = time.time() if now is None else now
        quiet = quiet_for(self.ranks_dir, now, self.output)
        if started is not None:
            quiet = now - started if quiet is None else min(quiet, now - started)
        if quiet is None or quiet < (timeout or self.timeout) or now < self._next_probe:
            return None
        marks = exits.read(self.job_dir, started or 0.0) if self.job_dir else {}
        left = exits.grace_left(marks, self.timeout, now)
        if left is not None:  # every rank's program returned: an exit, however slow, is no hang
            return self._finish(marks, now) if left <= 0 else None
        notes: list[str] = []
        try:
            stacks = probe_job(self.match, self.node_argv(), self.runner, notes)
        except (RuntimeError, OSError, TorchHPCError) as e:
            self.say(f"torchhpc: hang: probe failed: {e}")
            stacks = []
        for n in notes:
            self.say(n)
        # A rank still importing (or waiting for its warm standby to fork it) is starting, not hung, however
        # little CPU it gets: 64 ranks sharing two cores each got 0.03-0.05 CPU-s in the 2 s sample while
        # importing torch (measured).
        busy = [s.rank for s in stacks if s.cpu_s >= BUSY_CPU_S or starting(s.frames)]
        if not stacks or busy:  # silent but computing, or starting (or gone): not a hang; look again later
            self._next_probe = now + max(10.0, self.timeout / 2)
            return None
        # A rank in its exit (Lightning's teardown, destroy_process_group, the interpreter joining threads)
        # is ending, not hung: under load its exit stayed quiet and idle for 46 s and the watch ended a
        # run that had finished. Unless another rank waits in a collective for it, it gets EXIT_GRACE_S more.
        # The boot's marks say so too (its program returned, or its teardown began), where py-spy read no stack:
        # under load it failed on ranks in their exit, and the watch ended a run that had printed FINISHED.
        down = exits.in_teardown(self.job_dir, started or 0.0) if self.job_dir else set()
        ending = tuple(s.rank for s in stacks if exiting(s.frames) or s.rank in marks or (not s.frames and s.rank in down))
        waiting = any(in_collective(s.frames) for s in stacks if s.rank not in ending)
        if ending and not waiting and quiet < (timeout or self.timeout) + EXIT_GRACE_S:
            if not self._said_ending:
                from torchhpc.jobdir.logs import format_ranks

                self.say(f"torchhpc: hang: {plural(len(ending), 'rank')} {format_ranks(ending)} quiet for "
                         f"{quiet:.0f}s in {plural(len(ending), 'its', 'their')} exit: not a hang yet "
                         f"(up to {EXIT_GRACE_S:.0f} s more)")
                self._said_ending = True
            self._next_probe = now + max(10.0, self.timeout / 2)
            return None
        verdict = with_flight(culprit(stacks), self.job_dir)
        self.fired, self.quiet = True, quiet
        for line in render(verdict, quiet):
            self.say(line)
        saved = save(self.job_dir, verdict, quiet) if os.path.isdir(self.job_dir) else ""
        doing = self.acting or {"cancel": "cancelling the job", "requeue": "requeueing the job"}.get(self.on_hang,
                                                                                                  f"{self.on_hang} the job")
        self.say(f"torchhpc: hang: {doing}" + (f"; every rank's stack is in {saved}" if saved else ""))
        self.act(self.on_hang)
        return verdict


    def _finish(self, marks: Mapping[int, exits.Ended], now: float) -> Optional[HangVerdict]:
        """Every rank's program has returned and the exit grace is spent: say who hung at exit and where,
        then have what is left stopped (``act("finish")``): the job completed."""
        try:
            stacks = probe_job(self.match, self.node_argv(), self.runner)
        except (RuntimeError, OSError, TorchHPCError) as e:
            self.say(f"torchhpc: hang: probe failed: {e}")
            return None
        # One that exited while py-spy read it is gone, and one using CPU is still exiting, not stopped: under
        # load 10 the exits of two ranks that had imported torch took 6 s, and were called hangs at exit.
        # A busy one is stopped too once EXIT_GRACE_S more have passed.
        late = now - max(e.time for e in marks.values()) >= self.timeout + EXIT_GRACE_S
        stacks = [s for s in stacks if s.error != EXITED and (late or s.cpu_s < BUSY_CPU_S)]
        lines = exits.hung_at_exit(marks, stacks, now)
        if not lines:  # nothing of the job is left, or it is still exiting: it ends by itself
            self._next_probe = now + max(10.0, self.timeout / 2)
            return None
        self.fired = self.finished = True
        for line in lines:
            self.say(f"torchhpc: hang at exit: {line}")
        self.say("torchhpc: every rank's program had ended: stopping what is left; the job completed")
        self.act("finish")
        return HangVerdict((), (), tuple(stacks), at_exit=tuple(lines))


def watch_job(scheduler: Scheduler, job_id: str, timeout: float, on_hang: str,
              act: Optional[Callable[[str], None]], say: Callable[[str], None]) -> Optional[HangWatch]:
    """The hang watch for a job torchhpc submitted, from its record: its rank files (or the local
    log), how to reach its nodes, and what to do once the hang is named (``act``; by default cancel,
    or ``scontrol requeue``). None, said in one line, when no log file is known for the job.
    ``torchhpc wait``/``run`` (cli/follow.py) and a local background job's own process
    (supervisor/background.py) watch through this."""
    from torchhpc.jobdir.logs import job_log

    log = job_log(scheduler.name, job_id)
    if log is None or not (log.ranks_dir or log.output):
        say(f"torchhpc: --hang-timeout: no log files known for {Handle(scheduler.name, job_id)}; not watching")
        return None
    job_dir = os.path.dirname(log.ranks_dir) if log.ranks_dir else os.path.dirname(log.output or "")
    alloc = scheduler.allocation_of(job_id)
    match = alloc.rank_match()

    def default_act(what: str) -> None:
        if what == "requeue":
            alloc.requeue()
        else:
            scheduler.cancel(job_id)

    def node_argv() -> list[str] | None:  # asked when probing: a pending job's "nodes" is only a count
        return None if alloc.here else alloc.on_nodes(probe_argv(match), alloc.nodes())

    return HangWatch(match, timeout, on_hang, log.ranks_dir or "", job_dir, node_argv, act or default_act, say,
                     runner=getattr(scheduler, "runner", None), output=log.output or "")
