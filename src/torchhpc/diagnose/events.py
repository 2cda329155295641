"""``torchhpc events``: one timeline of a job on the scheduler's clock, and the account under it.

It merges what each part of torchhpc already leaves behind, read after the fact:

* the scheduler's own times (:meth:`Scheduler.times`: sacct's Submit/Eligible/Start/End, PBS's
  qtime/etime/stime, the local record) and the pending reason it still shows;
* each attempt of ``<job dir>/attempts.json`` (the supervisor's): launched, first output line,
  the health gate, the fault and how it was found, teardown, exclusions, the restart;
* the hang watch's ``hang.json`` and the Flight Recorder's ``fr/`` findings;
* the end marker ``end.json``.

Reading a finished job costs what :meth:`Scheduler.times` costs (on Slurm one accounting call,
no controller call); everything else is files in the job directory.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import torchhpc.diagnose.flight as flight
import torchhpc.diagnose.hang as hang
from torchhpc.core.handle import Handle
from torchhpc.core.units import counted, plural
from torchhpc.diagnose.account import Account, _num, account, duration
from torchhpc.jobdir.attempts import load_attempts, shrunk
from torchhpc.jobdir.endmark import read_end
from torchhpc.jobdir.layout import CHECKPOINT, HANG, read_json
from torchhpc.jobdir.record import read_record
from torchhpc.schedulers.api import Scheduler
from torchhpc.schedulers.times import JobTimes

__all__ = ["Event", "Timeline", "gather", "timeline"]



@dataclass(frozen=True)
class Event:
    time: float
    kind: str  # submit eligible pending start attempt health first-line fault hang flight teardown exclude restart end
    text: str = ""
    attempt: Optional[int] = None
    nodes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"time": round(self.time, 3), "kind": self.kind}
        if self.text:
            d["text"] = self.text
        if self.attempt is not None:
            d["attempt"] = self.attempt
        if self.nodes:
            d["nodes"] = list(self.nodes)
        return d


@dataclass(frozen=True)
class Timeline:
    job: str
    times: JobTimes
    events: tuple[Event, ...]
    account: Account
    attempts: tuple[Mapping[str, Any], ...] = ()
    running: bool = False
    notes: tuple[str, ...] = field(default=())
    runs: tuple[Mapping[str, Any], ...] = ()  # what the account and the plot count: attempts, else the job as one

    def to_json(self) -> dict[str, Any]:
        # exit_code: the record's code, as status --json and diagnose --json carry it (README's exit-code table)
        return {"job": self.job, "source": self.times.source, "state": self.times.state,
                "exit_code": self.times.exit_code, "running": self.running, "events": [e.to_json() for e in self.events], "account": self.account.to_json(),
                "notes": list(self.notes)}

    def render(self) -> str:
        """The timeline (clock time, and + since submit), the account, and the ETTR line last."""
        t0 = self.events[0].time if self.events else 0.0
        where = {"record": "torchhpc's record of the job"}.get(self.times.source, self.times.source or "nowhere")
        out = [f"events of {self.job} (times from {where}):"]
        for e in self.events:
            clock = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.time))
            which = f" {e.attempt}" if e.kind == "attempt" else f" attempt {e.attempt}" if e.attempt is not None else ""
            nodes = f" {','.join(e.nodes)}" if e.nodes else ""
            text = f" {e.text}" if e.text else ""
            out.append(f"  {clock} +{_plus(e.time - t0):>9}  {e.kind:<10}{which}{nodes}{text}".rstrip())
        a = self.account
        out.append("account:")
        out.append(f"  wall {duration(a.wall_s)} = queue {a.queue_s:.1f} s + start-up {a.startup_s:.1f} s"
                   f" + productive {a.productive_s:.1f} s + lost {a.lost_s:.1f} s + shutdown {a.shutdown_s:.1f} s")
        rows = {int(r.get("attempt") or 0): r for r in self.runs or self.attempts}
        for n, i in enumerate(a.incidents, 1):
            rec = f"{i.recompute_s:.1f} s" if i.recompute_known else "unknown (no checkpoint time)"
            out.append(f"  incident {n} (attempt {i.attempt}, {i.klass}, found by {i.found_by or '?'}): "
                       f"detection {_detection(i.found_by, i.detection_s, rows.get(i.attempt, {}))}, "
                       f"teardown {i.teardown_s:.1f} s, health gate {i.health_s:.1f} s, "
                       f"restart {i.restart_s:.1f} s, recompute {rec}{i.resume_note()}")
        out.extend(f"  note: {n}" for n in self.notes)
        ended = self.times.state if not self.running and self.times.state not in ("", "COMPLETED") else ""
        # a job that did not complete kept only what it checkpointed: its "productive" time is not a result
        out.append(a.line() + (" (still running)" if self.running else "")
                   + (f" (the job ended {ended}: its work counts only as far as it checkpointed)" if ended else ""))
        return "\n".join(out) + "\n"


def _detection(found_by: str, seconds: float, row: Mapping[str, Any]) -> str:
    """The detection time as known: a fault the heartbeats found was seen about a second after it; one the
    supervisor's probe found happened at most one probe interval before it was seen (the account counts it
    as found when seen: 0 s), so the bound is said."""
    if found_by == "heartbeat":  # its ranks' last beat, then SILENT_S and one probe (supervisor/liveness.py)
        return "about 1 s (the heartbeats' silence, then one probe)"
    if found_by != "probe":
        return f"{seconds:.1f} s"
    every = _num(row, "probe_s")
    return f"<= {every:g} s (the probe's interval)" if every else "<= the probe's interval (not recorded)"


_END_CLASS = {"FAILED": "failure", "TIMEOUT": "time-limit", "DEADLINE": "time-limit", "NODE_FAIL": "node-failure",
              "BOOT_FAIL": "node-failure", "OUT_OF_MEMORY": "host-oom", "PREEMPTED": "preempted"}


def _as_one_attempt(start: Optional[float], stop: float, running: bool, state: str, nodes: tuple[str, ...],
                    hang_info: Optional[Mapping[str, Any]], hang_time: Optional[float]) -> list[dict[str, Any]]:
    """A job without attempts.json (no supervisor) as the one attempt it was, for the account and the plot:
    a hang the watch named, or an end the scheduler calls a failure, is its incident (it was counted
    "ETTR 100 %, 0 incidents")."""
    if start is None:
        return []
    row: dict[str, Any] = {"attempt": 0, "started": start, "nodes": list(nodes), "ended": None if running else stop}
    klass = "hang" if hang_info is not None else _END_CLASS.get(state.split()[0] if state else "", "")
    if klass and not running:
        fault = hang_time if hang_info is not None and hang_time is not None else stop
        row.update({"class": klass, "fault": min(fault, stop),
                    "found_by": "hang-watch" if hang_info is not None else "step-end"})
    return [row]


def _scheduler_runs(runs: Sequence[tuple[float, float, str]]) -> list[dict[str, Any]]:
    """A requeued job's earlier runs (the scheduler's times) as the account's attempts: each ended by its requeue."""
    return [{"attempt": i, "started": b, "ended": e, "nodes": [n], "class": "requeued", "fault": e, "found_by": "scheduler"}
            for i, (b, e, n) in enumerate(runs)]


def _start_nodes(attempts: Sequence[Mapping[str, Any]], final: str) -> tuple[str, ...]:
    """The nodes the job started on: every node an attempt ran on or excluded (a job resized after a node
    loss ends with fewer: the scheduler's NodeList is the end's), else the scheduler's list."""
    from torchhpc.core.hostlist import compress

    seen = {str(h) for a in attempts for key in ("nodes", "excluded") for h in a.get(key) or ()}
    return (compress(sorted(seen)),) if seen else ((final,) if final else ())


def _plus(s: float) -> str:
    s = max(0.0, s)
    h, rest = divmod(int(s), 3600)
    m, sec = divmod(rest, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m:02d}:{sec:02d}"


def _attempt_events(attempts: Sequence[Mapping[str, Any]]) -> list[Event]:
    out: list[Event] = []
    excluded: set[str] = set()
    rows = sorted(attempts, key=lambda a: int(a.get("attempt") or 0))
    full = max((int(a["world_size"]) for a in rows if a.get("world_size")), default=0)
    for a in rows:
        n = int(a.get("attempt") or 0)
        nodes = tuple(str(x) for x in a.get("nodes") or ())
        launched = _num(a, "launched") or _num(a, "started")
        health = a.get("health")
        bad: dict[str, Any] = health if isinstance(health, dict) else {}
        if launched is not None and (bad or _num(a, "health_s")):
            why = "; ".join(f"{k}: {v}" for k, v in bad.items()) or "passed"
            took = _num(a, "health_s")
            out.append(Event(launched - (took or 0.0), "health", f"{why}" + (f" ({took:.1f} s)" if took else ""), n,
                             tuple(bad)))
        if launched is not None:
            if n:
                out.append(Event(launched, "restart", "", n))
            out.append(Event(launched, "attempt", shrunk(dict(a), full).strip(), n, nodes))
        if _num(a, "first_line") is not None:
            out.append(Event(float(a["first_line"]), "first-line", "", n))
        klass = a.get("class")
        fault = _num(a, "fault") or (_num(a, "ended") if klass else None)
        if klass and fault is not None:
            who = f" rank {a['rank']}" if a.get("rank") is not None else ""
            detail = f": {a['detail']}" if a.get("detail") else ""
            how = f" (found by {a['found_by']})" if a.get("found_by") else ""
            step = f", checkpoint step {a['checkpoint_step']}" if a.get("checkpoint_step") is not None else ""
            out.append(Event(fault, "fault", f"{klass}{who}{how}{step}{detail}", n))
        ended = _num(a, "ended")
        if ended is not None:
            if klass:
                gone = f"step gone after {ended - fault:.1f} s" if fault is not None else "step gone"
                out.append(Event(ended, "teardown", gone, n))
            else:
                out.append(Event(ended, "attempt-end", "succeeded", n))
        new = [str(x) for x in a.get("excluded") or () if str(x) not in excluded]  # the list is cumulative
        excluded.update(new)
        if new and ended is not None:
            out.append(Event(ended, "exclude", "", n, tuple(new)))
    return out


def timeline(job: str, times: JobTimes, attempts: Sequence[Mapping[str, Any]], *,
             hang_info: Optional[Mapping[str, Any]] = None, hang_time: Optional[float] = None,
             findings: Sequence[flight.Finding] = (), findings_time: Optional[float] = None,
             end_mark: Optional[tuple[float, str, Optional[int]]] = None, now: Optional[float] = None) -> Timeline:
    """The merged events and their account. Pure: the caller (:func:`gather`) reads the files."""
    now = time.time() if now is None else now
    notes: list[str] = []
    first = [t for a in attempts for t in (_num(a, "launched"), _num(a, "started")) if t is not None]
    start = times.start if times.start is not None else (min(first) if first else None)
    if times.runs and not attempts:  # a requeued job began with its first run, not its last
        start = min(times.runs[0][0], start) if start is not None else times.runs[0][0]
    if times.start is not None and first and min(first) < times.start:
        notes.append("the scheduler's Start is its last run's (a requeued job): the first attempt comes before it")
        start = min(first)
    submit = times.submit if times.submit is not None else (start if start is not None else now)
    submit = min(submit, start) if start is not None else submit
    end = times.end
    if end is None and end_mark is not None:
        end = end_mark[0]
    running = end is None
    stop = now if end is None else end
    # the state now only while it runs or waits: an ended job's end row says how it ended
    events: list[Event] = [Event(submit, "submit", f"state now {times.state}" if times.state and end is None else "")]
    if times.eligible is not None:
        events.append(Event(times.eligible, "eligible"))
    events.extend(Event(t, "pending", why) for t, why in times.reasons)
    if start is not None:
        events.append(Event(start, "start", "", None, _start_nodes(attempts, times.nodes)))
    events.extend(_attempt_events(attempts))
    if hang_info is not None and hang_time is not None:
        from torchhpc.jobdir.logs import format_ranks

        culprits = tuple(int(r) for r in hang_info.get("culprits") or ())
        quiet = _num(hang_info, "quiet_s")
        who = f"{plural(len(culprits), 'rank')} {format_ranks(culprits)}" if culprits else "every rank"
        events.append(Event(hang_time, "hang", f"{who} quiet for {quiet or 0:.0f} s"
                            + (f": {hang_info['flight'][0]}" if hang_info.get("flight") else "")))
    events += [Event(findings_time or stop, "flight", f"{f.kind}: {f.line()}") for f in findings]
    if not running:
        code = times.exit_code if times.exit_code is not None else (end_mark[2] if end_mark else None)
        state = times.state or (end_mark[1] if end_mark else "")
        events.append(Event(stop, "end", f"{state}" + (f", exit {code}" if code is not None else "")))
    runs: Sequence[Mapping[str, Any]] = attempts
    if not attempts:
        state = times.state or (end_mark[1] if end_mark else "")
        last = times.start if times.runs and times.start is not None else start  # a requeued job's last run began here
        runs = _as_one_attempt(last, stop, running, state, _start_nodes((), times.nodes), hang_info, hang_time)
        if times.runs and runs:  # a requeued job: each run the scheduler kept is an attempt; each requeue an incident
            notes.append(f"requeued {counted(len(times.runs), 'time')}, not supervised: each run is an attempt, its "
                         "requeue an incident; when a run's first line came is not recorded (start-up counts as productive)")
            runs = [*_scheduler_runs(times.runs), {**runs[0], "attempt": len(times.runs)}]
        else:
            notes.append("one attempt, not supervised (no --max-restarts or --spares): when its first line came is not "
                         "recorded, so start-up is counted as productive")
    quiet = _num(hang_info, "quiet_s") if hang_info else None
    acct = account(submit, start if start is not None else stop, stop, runs, quiet)
    events.sort(key=lambda e: e.time)  # stable: same-time events keep their causal order
    return Timeline(job, times, tuple(events), acct, tuple(attempts), running, tuple(notes), tuple(runs))


def _mtime(path: str) -> Optional[float]:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def _with_checkpoint_times(job_dir: str, attempts: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Give each failed attempt that lacks one a ``checkpoint_time`` (the account's recompute starts there):
    when the newest checkpoint finished before its fault; and, where the helper recorded them, the step of
    that checkpoint and the step the next attempt resumed and from where (memory, a peer's copy, disk): the
    steps the incident lost. Completion times come from ``checkpoint.json`` (torchhpc.dist.checkpoint writes
    its last completions and resumes there) and from the complete checkpoints in the disk directory it
    names (a ``ckpt-N/`` directory's mtime: DCP's ``.metadata``, its last write, landed then; temporary
    ``.ckpt-*`` names are not complete)."""
    import re

    try:
        marker = read_json(os.path.join(job_dir, CHECKPOINT))  # None, unreadable: AttributeError below
        saved = [(int(row[0]), float(row[1])) for row in marker.get("completed") or []]
        resumed = sorted((float(row[0]), int(row[1]), str(row[2])) for row in marker.get("resumed") or [])
        done = [t for _, t in saved] + ([float(marker["time"])] if "time" in marker else [])
        where = os.path.dirname(str(marker.get("path") or ""))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError):
        return list(attempts)
    complete = re.compile(r"^ckpt-\d{9}(\.pt)?$")
    for entry in os.listdir(where) if where and os.path.isdir(where) else []:
        path = os.path.join(where, entry)
        if complete.match(entry) and (entry.endswith(".pt") or os.path.isfile(os.path.join(path, ".metadata"))):
            done += [t for t in (_mtime(path),) if t is not None]
    out: list[Mapping[str, Any]] = []
    for a in attempts:
        fault = _num(a, "fault") or _num(a, "ended")
        before = [t for t in done if fault is not None and t <= fault]
        row = dict(a)
        if a.get("class") and before and _num(a, "checkpoint_time") is None:
            row["checkpoint_time"] = max(before)
        if a.get("class") and fault is not None:
            steps = [s for s, t in saved if t <= fault]
            after = [r for r in resumed if r[0] > fault]
            if steps:
                row.setdefault("last_step", max(steps))
            if after:
                row.setdefault("resumed_step", after[0][1])
                row.setdefault("resumed_from", after[0][2])
        out.append(row)
    return out


def gather(scheduler: Scheduler, name: str, job_id: str, now: Optional[float] = None) -> Timeline:
    """Read the job: the scheduler's times (one call, :meth:`Scheduler.times`), then its directory's files."""
    times = scheduler.times(job_id)
    job_dir = read_record(name, job_id).job_dir or scheduler.end_dir(job_id) or ""
    attempts = _with_checkpoint_times(job_dir, load_attempts(job_dir)) if job_dir else []
    hang_info = hang.load(job_dir) if job_dir else None
    done = times.state == "COMPLETED" and times.exit_code in (0, None)  # a job that succeeded has no culprit
    findings = flight.post_mortem(job_dir, done) if job_dir else []
    mark = read_end(job_dir) if job_dir else None
    return timeline(
        str(Handle(name, job_id)), times, attempts, hang_info=hang_info,
        hang_time=_mtime(os.path.join(job_dir, HANG)) if hang_info else None,
        findings=findings, findings_time=_mtime(os.path.join(job_dir, flight.FR_DIR)) if findings else None,
        end_mark=(mark.time, mark.state, mark.exit_code) if mark and mark.time else None, now=now,
    )
