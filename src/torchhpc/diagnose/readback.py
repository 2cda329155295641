"""One verdict for every kind of job: plain, array or sweep task, function, restarted, never started.

:func:`~torchhpc.diagnose.verdict.diagnose` weighs one run's evidence. What a job *is* changes which
evidence counts, never how it is read back, so every reader (``torchhpc diagnose``, the verdict
after ``run --wait``/``wait``, ``Job.diagnose()``) asks :func:`diagnose_job`, which applies the
kind's rules first:

* **the record wins**: a job whose record says COMPLETED with exit 0 has no failure, whatever an
  earlier attempt left behind (the ``hang.json`` of an attempt the supervisor restarted);
* **a job that never started** (its dependency was never satisfied) gets no rank verdict: nothing ran;
* **an array's tasks** (the local scheduler keeps every task's lines in one log, each behind
  ``[task I]``) get one verdict each, from that task's own lines and its own end line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace
from typing import Optional

from torchhpc.core.units import counted, plural
from torchhpc.diagnose.evidence import Evidence, gather
from torchhpc.diagnose.verdict import Verdict, diagnose
from torchhpc.jobdir.layout import HANG
from torchhpc.jobdir.logs import TASK_END_LINE, Line, format_ranks

__all__ = ["TaskVerdicts", "diagnose_job", "never_started", "printable", "read_back"]


def never_started(ev: Evidence) -> bool:
    """Whether the job never ran: its dependency was never satisfied (Slurm's reason, and the local
    scheduler's own words), so no rank has anything to say."""
    return "DependencyNeverSatisfied" in (ev.reason or "") and not ev.rank_logs and not any(
        ln.rank is not None for ln in ev.lines)


@dataclass(frozen=True)
class TaskVerdicts(Verdict):
    """An array's verdict: its first failed task's, and every task's own (``tasks``)."""

    tasks: tuple[tuple[int, Verdict], ...] = ()

    def render(self) -> str:
        failed = [(t, v) for t, v in self.tasks if not v.ok]
        done = [t for t, v in self.tasks if v.ok]
        out = []
        for t, v in failed[:4]:
            out.append("".join(f"task {t}: {line}\n" if i == 0 else f"{line}\n"
                               for i, line in enumerate(v.render().splitlines())))
        if len(failed) > 4:
            out.append(f"... and {plural(len(failed) - 4, 'more failed task')}: "
                       f"{format_ranks(t for t, _v in failed[4:])} (torchhpc diagnose --json lists each)\n")
        if done:
            out.append(f"{plural(len(done), 'task')} {format_ranks(done)} completed\n")
        return "".join(out) or super().render()

    def to_json(self) -> dict[str, object]:
        d = super().to_json()
        d["tasks"] = [{"task": t, **v.to_json()} for t, v in self.tasks]
        return d


def _tasks(ev: Evidence) -> list[tuple[int, Evidence]]:
    """Each task's own evidence from a log that holds every task's lines (empty: not such a log)."""
    ids = sorted({ln.task for ln in ev.lines if ln.task is not None})
    out = []
    for t in ids:
        lines = [Line(ln.rank, ln.text, ln.node) for ln in ev.lines if ln.task == t]
        state, code, reason = "RUNNING", None, ""
        for ln in lines:
            m = TASK_END_LINE.match(ln.text) if ln.rank is None else None
            if m:
                state, code, reason = m.group(2), int(m.group(3)), m.group(5) or ""
        # the task's own end line is the record of that task; the job's files belong to no single task
        out.append((t, replace(ev, lines=[*lines, Line(None, reason)] if reason else lines, state=state,
                               exit_code=code, reason=reason, failed_at={}, rank_logs={}, hang=None, flight=(),
                               attempts=())))
    return out


def _one(ev: Evidence) -> Verdict:
    if ev.state == "COMPLETED" and ev.exit_code in (0, None):
        ended = [str(a.get("class") or "") for a in ev.attempts[:-1]]
        after = ""
        if ended:
            first = ev.attempts[0].get("attempt", 0)  # numbered from 0, as status and events number them
            after = f" after {counted(len(ended), 'restart')} (attempt {first} ended {ended[0] or 'early'})" \
                if len(ended) == 1 else f" after {counted(len(ended), 'restart')} ({', '.join(x or '?' for x in ended)})"
        return Verdict("none", f"no failure: the job completed{after}", None, (), "", ev.job, ev.state, ev.exit_code,
                       (f"scheduler state COMPLETED, exit code {ev.exit_code if ev.exit_code is not None else 0}",))
    if never_started(ev):
        why = ev.reason.split(": ", 1)[1] if ": " in ev.reason else ev.reason
        return Verdict("cancelled", f"the job never started: a job it depends on did not end as required ({why})",
                       None, (), "see how that job ended: `torchhpc status` and `torchhpc diagnose` of it",
                       ev.job, ev.state, ev.exit_code, (f"scheduler reason {ev.reason}",))
    v = diagnose(ev)
    return _with_stacks(v, ev) if ev.hang and v.klass == "hang" else v


def _with_stacks(v: Verdict, ev: Evidence) -> Verdict:
    """A hang's next step names where each rank is and the file that holds every stack, in place of "the
    stacks above", which no reader printed (hang.json is the watch's record, diagnose/hang.py)."""
    from torchhpc.diagnose.hang_verdict import user_frame

    stacks = [s for s in (ev.hang or {}).get("stacks", ()) if isinstance(s, dict) and s.get("frames")]  # type: ignore[attr-defined]
    if not stacks or "stacks above" not in v.next_step:
        return v
    where: dict[str, list[int]] = {}
    for s in stacks:
        frames = [tuple(f) for f in s["frames"]]
        at = user_frame(frames) or f"{frames[0][1]}:{frames[0][2]}"
        where.setdefault(f"{at} ({frames[0][0]})", []).append(int(s["rank"]))
    seen = "; ".join(f"{plural(len(r), 'rank')} {format_ranks(r)} at {at}" for at, r in list(where.items())[:3])
    path = f"{ev.job_dir}/{HANG}" if ev.job_dir else HANG
    return replace(v, next_step=f"{seen} (every stack: {path}); `torchhpc logs {ev.job or 'JOB'}` shows what each printed")


def read_back(ev: Evidence) -> Verdict:
    """The verdict for a job of any kind from its evidence (see the module docstring)."""
    tasks = _tasks(ev)
    if not tasks:
        return _one(ev)
    return _of_tasks(ev, tuple((t, _one(e)) for t, e in tasks))


def diagnose_job(scheduler: object, name: str, job_id: str) -> Verdict:
    """Gather a job's evidence and read it back by its kind: what every command that shows a verdict calls.
    An array whose tasks are jobs of their own (Slurm ``7_2``, PBS ``7[2]``) gets each task's verdict, from
    that task's own evidence."""
    ev = gather(scheduler, name, job_id)
    try:
        tasks = list(scheduler.status(job_id).tasks)  # type: ignore[attr-defined]
    except Exception:  # the verdict works from what it has
        tasks = []
    if not tasks:
        return read_back(ev)
    verdicts: list[tuple[int, Verdict]] = []
    for t in tasks:
        m = re.search(r"_(\d+)$|\[(\d+)\]", t.job_id)  # Slurm's 7_2, PBS's 7[2].server
        index = int(m.group(1) or m.group(2)) if m else len(verdicts)
        verdicts.append((index, read_back(gather(scheduler, name, t.job_id))))
    return _of_tasks(ev, tuple(verdicts))


def _of_tasks(ev: Evidence, verdicts: tuple[tuple[int, Verdict], ...]) -> TaskVerdicts:
    failed = [v for _t, v in verdicts if not v.ok]
    base = failed[0] if failed else Verdict("none", f"no failure: every task completed ({len(verdicts)})", None, (), "")
    own = {f.name: getattr(base, f.name) for f in fields(Verdict)}
    own.update(job=ev.job, state=ev.state, exit_code=ev.exit_code)
    return TaskVerdicts(**own, tasks=verdicts)


def printable(v: Verdict) -> Optional[str]:
    """The verdict to print after a failed job's output (None: nothing to add, as for a job that never ran)."""
    if v.ok or (v.klass == "cancelled" and v.summary.startswith("the job never started")):
        return None
    return v.render()
