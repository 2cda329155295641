"""Why a job failed, from the evidence it left: a verdict instead of "read the logs".

A failed distributed job leaves three kinds of evidence, and none alone names the culprit:

* **each rank's own log** (``ranks/rank-N@NODE.log``): the traceback of the rank that raised,
  and the ``Connection closed by peer`` tracebacks of every rank that only lost it; native
  crashes (``terminate called ...``, ``Segmentation fault``) and CUDA/NCCL messages;
* **the launcher's messages** in the scheduler output: srun's ``task 3: Aborted``, torchrun's
  ``Root Cause (first observed failure)`` block, mpirun's ``process rank 3 ... exited on signal
  6``. They carry the rank's *own* exit status or signal, which the job's exit code hides (srun
  and torchrun report the kill of the other ranks: 143 or 1);
* **the scheduler's accounting**: ``TIMEOUT``, ``OUT_OF_MEMORY``, ``NODE_FAIL``, ``PREEMPTED``,
  ``CANCELLED`` (and the batch step's ``*** ... DUE TO TIME LIMIT ***`` lines).

:func:`diagnose` weighs them in that order of authority: the scheduler's verdict on the whole
job first (a time limit explains every rank's death), then the launcher's first failed rank,
then the earliest rank whose own log shows a root cause (by when its file was last written).
Ranks whose only evidence is a lost peer are counted as consequences, not listed.

Pure: lines and facts in, :class:`Verdict` out. ``diagnose/evidence.py`` gathers them (the CLI, ``wait``, ``events``).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, replace
from typing import Optional

from torchhpc.core.exitcodes import EXIT_CODES
from torchhpc.core.processes import stopped_ranks
from torchhpc.core.units import counted, plural
from torchhpc.diagnose.classify import CLASSES, classify_text, launcher_events, node_failure_words, time_limit_words
from torchhpc.diagnose.evidence import Evidence, RankFailure
from torchhpc.jobdir.logs import format_ranks

__all__ = ["Verdict", "diagnose"]

# Scheduler-wide verdicts (sacct State, or the batch step's banner).
_JOB_STATES = {
    "TIMEOUT": "time-limit",
    "OUT_OF_MEMORY": "host-oom",
    "NODE_FAIL": "node-failure",
    "PREEMPTED": "preempted",
    "CANCELLED": "cancelled",
    "DEADLINE": "time-limit",
}
_BANNER = re.compile(r"\*\*\* (?:JOB|STEP) \S+ ON (\S+) CANCELLED AT \S+(?: DUE TO ([A-Z ]+?))? \*\*\*")
_BANNER_CLASS = {"TIME LIMIT": "time-limit", "PREEMPTION": "preempted", "NODE FAILURE": "node-failure"}
_OOM_EVENT = re.compile(r"Detected \d+ oom[-_]kill event|oom[-_]kill event")

@dataclass(frozen=True)
class Verdict:
    klass: str
    summary: str
    first: Optional[RankFailure]
    consequences: tuple[int, ...]
    next_step: str
    job: str = ""
    state: str = ""
    exit_code: Optional[int] = None
    evidence: tuple[str, ...] = ()
    alike: tuple[int, ...] = ()  # ranks whose own log shows the first's error: they failed by themselves

    @property
    def ok(self) -> bool:
        return self.klass == "none"

    def render(self) -> str:
        """At most 8 lines: the verdict, the first failed rank, the consequences, the next step."""
        if self.ok:
            return f"diagnosis: {self.summary}\n"
        out = [f"diagnosis: {self.klass} — {self.summary}"]
        f = self.first
        if f is not None:
            at = f" on {f.host}" if f.host else ""
            own = f", {f.exit}" if f.exit else ""
            label = {"hang": "culprit", "collective-mismatch": "culprit", "no-progress": "last attempt"}.get(self.klass)
            out.append(f"  {label or 'first failed'}: rank {f.rank}{at}{own}")
            if f.error:
                out.append(f"  {f.error[:200]}")
            if f.where:
                out.append(f"  at {f.where}")
            if f.log:
                out.append(f"  log: {f.log}")
        if self.alike:
            out.append(f"  {plural(len(self.alike), 'rank')} {format_ranks(self.alike)} failed the same way (the same "
                       f"error in {plural(len(self.alike), 'its own log', 'their own logs')})")
        n = len(self.consequences)
        who = f"{plural(n, 'rank')} {format_ranks(self.consequences)}"
        if self.consequences and self.klass in ("hang", "collective-mismatch"):
            out.append(f"  {who} waited for it in a collective")
        elif self.consequences and self.klass in ("cancelled", "time-limit", "preempted"):
            out.append(f"  {who} {plural(n, 'was', 'were')} stopped with it")
        elif self.consequences:
            out.append(f"  then {who} failed as a consequence (lost {plural(n, 'its', 'their')} "
                       "peer, or stopped by the launcher)")
        out.append(f"  next: {self.next_step}")
        return "\n".join(out[:8]) + "\n"

    def to_json(self) -> dict[str, object]:
        d = asdict(self)
        d["class"] = d.pop("klass")
        if self.first is not None:  # "when" sorts a rank without a time last (inf): strict JSON has no Infinity
            d["first"].update({"class": d["first"].pop("klass"), "when": self.first.when if self.first.when < 1e308 else None})
        d["consequences"] = list(self.consequences)
        d["alike"] = list(self.alike)
        d["evidence"] = list(self.evidence)
        return d


def diagnose(ev: Evidence) -> Verdict:
    """The verdict for one job from its evidence (see the module docstring for the weighing)."""
    if ev.hang:
        v = _hang_verdict(ev)
    else:
        v = _verdict(ev)
        v = _with_flight(v, ev) if ev.flight else v
    return _with_storm(v, ev)


def _with_storm(v: Verdict, ev: Evidence) -> Verdict:
    """After the supervisor's no-progress stop the job's class is no-progress (attempts.json's last class
    says so); the last attempt's own verdict stays in the summary and its culprit stays named."""
    last = ev.attempts[-1] if ev.attempts else {}
    if last.get("class") != "no-progress":
        return v
    words = str(last.get("detail") or "restart storm: no checkpoint advance").split("; the job ends")[0]
    step = CLASSES["no-progress"][1]
    own = f"; the last attempt: {v.klass} — {v.summary}" if v.klass not in ("none", "unknown", "no-progress") else ""
    return replace(v, klass="no-progress", summary=f"{words}{own}", next_step=step.format(job=ev.job or "JOB"),
                   evidence=(*v.evidence, "the supervisor's attempts"))


_LEFT_STEP = ("rank {rank} ended before the others: every rank must run the same collectives, then "
              "destroy_process_group(); read why it ended early in its log")


def _with_flight(v: Verdict, ev: Evidence) -> Verdict:
    """Where a rank left the group or the ranks' calls differ, the dumps name the rank the logs could not."""
    f = ev.flight[0]
    if v.klass not in ("lost-peer", "unknown", "native-crash", "collective-mismatch") or not f.culprits:
        return v
    # A rank with no dump proves nothing (a crash leaves none), and a crash's own words beat the
    # dumps unless they show the ranks' calls differ (gloo aborts on a size mismatch)
    if f.kind == "no-dump" or (v.klass == "native-crash" and not f.kind.startswith("mismatch")):
        return v
    klass = "collective-mismatch" if f.kind.startswith("mismatch") else v.klass
    r = f.culprits[0]
    own = v.first if v.first is not None and v.first.rank == r else None
    error = "exited with its process group still up (no destroy_process_group)" if f.kind == "left" else f.line()
    first = RankFailure(rank=r, host=ev.nodes.get(r, ""), klass=klass, exit=own.exit if own else "",
                        error=own.error if own else error, where=own.where if own else "", log=ev.rank_logs.get(r, ""))
    rest = tuple(x for x in sorted({*v.consequences, *v.alike, *((v.first.rank,) if v.first else ())}) if x != r)
    return replace(v, klass=klass, alike=(), summary=f.line(), first=first, consequences=rest,
                   next_step=_LEFT_STEP.format(rank=r) if f.kind == "left" else
                   CLASSES[klass][1] if klass != v.klass else v.next_step,
                   evidence=(*v.evidence, "fr/"))


def _verdict(ev: Evidence) -> Verdict:
    per_rank: dict[int, list[str]] = {}
    job_lines: list[str] = []
    for ln in ev.lines:
        if ln.rank is None:
            job_lines.append(ln.text)
        else:
            per_rank.setdefault(ln.rank, []).append(ln.text)
    logs_cmd = f"`torchhpc logs {ev.job}`" if ev.job else "`torchhpc logs JOB`"
    seen: list[str] = []

    # 1. the scheduler's verdict on the whole job
    job_class = _JOB_STATES.get(ev.state.split()[0] if ev.state else "", "")
    last = str(ev.attempts[-1].get("class") or "") if ev.attempts else ""
    if not job_class and last == "node-failure" and ev.exit_code == EXIT_CODES[last]:
        job_class = last  # the supervisor ended the job with its last attempt's class (its exit code says so)
    banner_host = ""
    for t in job_lines + [x for texts in per_rank.values() for x in texts]:
        m = _BANNER.search(t)
        if m and m.group(2) and not job_class:
            job_class = _BANNER_CLASS.get(m.group(2).strip(), job_class)
            banner_host = m.group(1)
        if _OOM_EVENT.search(t) and not job_class:
            job_class = "host-oom"
    if ev.state:
        seen.append(f"scheduler state {ev.state}" + (f", exit code {ev.exit_code}" if ev.exit_code is not None else ""))

    # 2. each rank's own evidence
    failures: dict[int, RankFailure] = {}
    for rank, texts in per_rank.items():
        klass, error, where = classify_text(texts)
        if not klass:
            continue
        failures[rank] = RankFailure(
            rank=rank, host=ev.nodes.get(rank, ""), klass=klass, error=error, where=where,
            log=ev.rank_logs.get(rank, ""), when=ev.failed_at.get(rank, float("inf")),
            consequence=klass == "lost-peer",
        )
    if failures:
        seen.append(f"{counted(len(failures), 'rank log')} with an error")

    # 3. the launcher's report: the rank's own end status, and who went first
    events = launcher_events(job_lines, ev.launcher, ev.nproc_per_node, local=ev.local)
    order: list[int] = []
    stopped: set[int] = set()  # ranks the launcher ended (SIGTERM) after another failed: consequences
    for rank, host, own in events:
        if own == "SIGTERM":
            stopped.add(rank)
        if own in ("SIGTERM", "") or rank in order:
            continue
        order.append(rank)
        prev = failures.get(rank) or RankFailure(rank=rank, klass="unknown", log=ev.rank_logs.get(rank, ""),
                                                 when=ev.failed_at.get(rank, float("inf")))
        klass = prev.klass
        if own.startswith("SIG") and own not in ("SIGTERM", "SIGKILL") and klass in ("unknown", "lost-peer"):
            klass = "native-crash"
        if own == "SIGKILL" and klass in ("unknown", "lost-peer"):
            klass = "host-oom" if job_class == "host-oom" else "unknown"
        failures[rank] = replace(
            prev, host=prev.host or host or ev.nodes.get(rank, ""), klass=klass, exit=own,
            error=prev.error or (f"killed by {own}" if own.startswith("SIG") else ""), consequence=klass == "lost-peer",
        )
    if events:
        # a rank the launcher reported twice (the local supervisor's line and torchrun's Root Cause) ended once
        ends = counted(len({e[0] for e in events}), "rank's end", "ranks' ends")
        seen.append(f"the local run saw {ends}" if ev.local else f"{ev.launcher or 'the launcher'} reported {ends}")

    # the first failed rank: the launcher's first report of a cause, else the earliest log
    causes = [f for f in failures.values() if not f.consequence]
    first = next((failures[r] for r in order if r in failures and not failures[r].consequence), None)
    if first is None and causes:
        first = min(causes, key=lambda f: (f.when, f.rank))
    if first is None and failures:
        first = min(failures.values(), key=lambda f: (f.when, f.rank))

    klass = job_class or (first.klass if first else "")
    if not klass:
        # "completed" only where the scheduler's record says so (style lesson 17: say what was seen)
        said = {"COMPLETED": "no failure: the job completed",
                "": "no failure in the logs; the scheduler no longer knows how this job ended",
                "PENDING": "no failure yet: the job is PENDING", "RUNNING": "no failure yet: the job is RUNNING"}
        if ev.state in said and ev.exit_code in (0, None):
            return Verdict("none", said[ev.state], None, (), "", ev.job, ev.state, ev.exit_code, tuple(seen))
        klass = "unknown"
    if job_class == "node-failure" and first is None and banner_host:
        first = RankFailure(rank=-1, host=banner_host, klass=klass)
    # every other rank of a failed job ended because of it: its launcher stopped it, or it lost its peer
    # (a rank stopped before it printed anything has only its log file, created at its start)
    others = set(failures) | stopped | set(ev.rank_logs)
    if ev.local:  # the local supervisor stops the other ranks still running when one fails, and says which
        named = stopped_ranks(ev.reason, ev.nproc_per_node)
        others |= set(range(ev.nproc_per_node)) if named is None else named
    consequences = tuple(sorted(r for r in others if first is None or r != first.rank))
    meaning, step = CLASSES.get(klass, CLASSES["unknown"])
    if first is not None and first.rank >= 0:
        logs_cmd = f"`torchhpc logs {ev.job or 'JOB'} --rank {first.rank}`"
    step = step.format(logs=logs_cmd, host=(first.host if first and first.host else "NODE"))
    if job_class and first is not None and first.klass != job_class:
        # the scheduler ended the job; the ranks' errors are what that did to them
        consequences = tuple(sorted(others))
        first = None if job_class in ("time-limit", "cancelled", "preempted") else first
    if klass == "cancelled":
        meaning, step, consequences = _cancelled(ev, consequences, bool(per_rank))
    if klass in ("time-limit", "node-failure"):  # in the batch script's and the supervisor's own words
        words = time_limit_words(job_lines) if klass == "time-limit" else node_failure_words(ev.attempts)
        meaning, step = words or (meaning, step)
    # a rank whose own log shows the first's error (two ranks on one GPU) failed by itself: not a consequence
    alike = tuple(r for r in consequences if _alike(failures.get(r), first))
    consequences = tuple(r for r in consequences if r not in alike)
    return Verdict(klass, meaning, first, consequences, step, ev.job, ev.state, ev.exit_code, tuple(seen), alike)


def _alike(f: Optional[RankFailure], first: Optional[RankFailure]) -> bool:
    """Whether ``f`` is its own failure of the same kind as ``first``: the same class, and the same line of the
    user's code or the same error (its words before the first colon: the exception's type, NCCL's message)."""
    if f is None or first is None or f.consequence or f.klass in ("unknown", "lost-peer") or f.klass != first.klass:
        return False
    head = f.error.split(":")[0].strip()
    return bool(f.where and f.where == first.where) or bool(head and head == first.error.split(":")[0].strip())


def _cancelled(ev: Evidence, ranks: tuple[int, ...], ran: bool) -> tuple[str, str, tuple[int, ...]]:
    """(summary, next step, ranks stopped) of a cancelled job, from what the scheduler recorded of it:
    a job that never started, a run interrupted here, the uid Slurm names; never a guess at who."""
    reason = ev.reason or ""
    if "DependencyNeverSatisfied" in reason or (not ran and "Dependency" in reason):
        return ("the job never started: a job it depends on did not end as required (DependencyNeverSatisfied)",
                f"see how the job it waited for ended: `torchhpc status {ev.job or 'JOB'}` names it", ())
    if not ran and not ev.rank_logs:
        ranks = ()
    m = re.search(r"interrupted by (SIG\w+)", reason)
    if m and m.group(1) == "SIGINT":
        return "the run was interrupted with Ctrl-C (SIGINT)", "nothing to fix: the run was interrupted", ranks
    if m:
        return (f"the run was stopped by {m.group(1)} (torchhpc cancel, or a kill)",
                "nothing to fix: the run was stopped", ranks)
    if reason.startswith("cancelled by torchhpc"):  # `torchhpc cancel` (or its hang watch) recorded who and when
        return f"the job was {reason}", "nothing to fix: the job was cancelled", ranks
    by = re.match(r"CANCELLED by (\d+)", ev.state or "")
    if by:
        return f"the job was cancelled by uid {by.group(1)}", "nothing to fix: the job was cancelled", ranks
    meaning, step = CLASSES["cancelled"]
    return meaning, step, ranks


def _hang_verdict(ev: Evidence) -> Verdict:
    """The verdict from the hang watch's record: the culprit rank, its stack, the ranks that waited."""
    from torchhpc.diagnose.hang_verdict import collective, user_frame

    h = ev.hang or {}
    stacks = {int(s["rank"]): s for s in h.get("stacks", ()) if isinstance(s, dict)}  # type: ignore[attr-defined]
    culprits = [int(r) for r in h.get("culprits", ())]  # type: ignore[attr-defined]
    waiting = tuple(sorted(int(r) for r in h.get("waiting", ())))  # type: ignore[attr-defined]
    flight = [str(x) for x in h.get("flight", ())]  # type: ignore[attr-defined]
    named = [int(r) for r in h.get("flight_culprits", ())]  # type: ignore[attr-defined]
    if named:  # the Flight Recorder saw which collective each rank reached: it outranks the stacks
        culprits = named + [r for r in culprits if r not in named]
        waiting = tuple(r for r in waiting if r not in named)
    first = None
    if culprits:
        s = stacks.get(culprits[0], {})
        frames = [tuple(f) for f in s.get("frames", ())]
        top = frames[0][0] if frames else ""
        first = RankFailure(
            rank=culprits[0], host=str(s.get("host", "")), klass="hang" if not named else str(h.get("flight_kind")),
            error=(f"in {collective(frames)}" if collective(frames) else f"not in a collective ({top})") if top
            else "",  # no stack read: the next step says why, nothing is claimed about where the rank is
            where=user_frame(frames), log=ev.rank_logs.get(culprits[0], ""),  # type: ignore[arg-type]
        )
    klass = "collective-mismatch" if str(h.get("flight_kind", "")).startswith("mismatch") else "hang"
    meaning, step = CLASSES[klass]
    quiet = h.get("quiet_s")
    note = str(h.get("note") or "")
    summary = meaning + (f" for {float(quiet):.0f}s" if isinstance(quiet, (int, float)) else "")  # type: ignore[arg-type]
    if flight:
        summary = flight[0]
    elif waiting:
        summary += "; the others wait in a collective"
    elif note:
        summary += f"; {note}"
    read = any(s.get("frames") for s in stacks.values())
    logs = f"`torchhpc logs {ev.job or 'JOB'}" + (f" --rank {first.rank}`" if first is not None else "`")
    if klass == "hang" and not read:  # say what is missing, never "see the stacks above"
        why = next((str(s.get("error")) for s in stacks.values() if s.get("error")), "") or "no stack was read"
        step = (f"stacks not read ({why}); {logs} shows what rank {first.rank} printed last" if first is not None
                else f"stacks not read ({why}); {logs} shows what each rank printed last")
    elif klass == "hang" and first is None:
        step = f"no rank waits in a collective: see where each rank is in the stacks above, or {logs}"
    return Verdict(klass, summary, first, waiting, step, ev.job, ev.state, ev.exit_code, ("the hang watch's stacks",))
