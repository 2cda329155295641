"""Where a job's wall time went: queue, start-up, productive time, and what each incident cost.

The account is a partition of the job's wall time (submit -> end on the scheduler's clock), so
its parts sum to the wall time: every instant belongs to exactly one part.

* **queue**: submit -> start (the scheduler's Start);
* **start-up**: start -> the first attempt's first output line (the batch script, the launch,
  imports, the rendezvous);
* **productive**: each attempt's first line -> its fault (or its end), less the incident's
  detection and recompute;
* per **incident** (an attempt that ended with a class): **detection** (the hang watch's quiet
  time; a probe or a step's end is counted as detected when it happened), **recompute** (the work
  since the last checkpoint, done again), **teardown** (detection -> the step gone), **health gate**
  and **restart** (the step gone -> the next attempt's first line);
* **shutdown**: the last attempt's end -> the job's end.

ETTR (effective training time ratio, "goodput") is productive / wall. Pure: numbers in, numbers out;
the attempts are ``attempts.json``'s objects, read with ``.get`` (old records lack newer keys).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

__all__ = ["PARTS", "Account", "Incident", "account", "duration"]

PARTS = ("detection", "teardown", "health gate", "restart", "recompute")


@dataclass(frozen=True)
class Incident:
    attempt: int
    klass: str
    found_by: str
    fault: float
    detection_s: float = 0.0
    teardown_s: float = 0.0
    health_s: float = 0.0
    restart_s: float = 0.0
    recompute_s: float = 0.0
    recompute_known: bool = False
    resumed_step: Optional[int] = None  # where the next attempt resumed (torchhpc.dist.checkpoint's record)
    resumed_from: str = ""  # memory | peer | disk
    steps_lost: Optional[int] = None  # the newest save's step before the fault minus the resumed step

    def resume_note(self) -> str:
        """``, resumed step 41 from memory (1 step lost)``; empty where the helper recorded no resume."""
        if self.resumed_step is None:
            return ""
        where = {"peer": "a peer's memory copy"}.get(self.resumed_from, self.resumed_from or "?")
        lost = "" if self.steps_lost is None else f" ({self.steps_lost} step{'s' * (self.steps_lost != 1)} lost)"
        return f", resumed step {self.resumed_step} from {where}{lost}"

    @property
    def lost_s(self) -> float:
        return self.detection_s + self.teardown_s + self.health_s + self.restart_s + self.recompute_s

    def parts(self) -> dict[str, float]:
        return dict(zip(PARTS, (self.detection_s, self.teardown_s, self.health_s, self.restart_s, self.recompute_s)))

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["class"] = d.pop("klass")
        d["lost_s"] = round(self.lost_s, 3)
        return d


@dataclass(frozen=True)
class Account:
    wall_s: float
    queue_s: float
    startup_s: float
    productive_s: float
    shutdown_s: float
    incidents: tuple[Incident, ...] = field(default=())

    @property
    def lost_s(self) -> float:
        return sum(i.lost_s for i in self.incidents)

    @property
    def ettr(self) -> float:
        return self.productive_s / self.wall_s if self.wall_s > 0 else 0.0

    def parts(self) -> dict[str, float]:
        """Time lost by part, over all incidents."""
        out = dict.fromkeys(PARTS, 0.0)
        for i in self.incidents:
            for k, v in i.parts().items():
                out[k] += v
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "wall_s": round(self.wall_s, 3), "queue_s": round(self.queue_s, 3), "startup_s": round(self.startup_s, 3),
            "productive_s": round(self.productive_s, 3), "lost_s": round(self.lost_s, 3),
            "shutdown_s": round(self.shutdown_s, 3), "incidents": len(self.incidents),
            "ettr": round(self.ettr, 4), "lost_by_part_s": {k: round(v, 3) for k, v in self.parts().items()},
            "incident_list": [i.to_json() for i in self.incidents],
        }

    def line(self) -> str:
        """``ETTR 96.8 % over 41 h, 3 incidents, 37 min lost, 29 of them recompute``."""
        n = len(self.incidents)
        head = f"ETTR {100 * self.ettr:.1f} % over {duration(self.wall_s)}, {n} incident{'' if n == 1 else 's'}"
        if not n:
            return head
        lost = self.lost_s
        part, most = max(self.parts().items(), key=lambda kv: kv[1])
        unit = duration(lost)
        return f"{head}, {unit} lost, {duration(most, like=lost).split()[0]} of them {part}"


def duration(s: float, like: Optional[float] = None) -> str:
    """``12.3 s``, ``37 min``, ``41 h``; ``like``: the unit another duration takes (to say "29 of them")."""
    ref = s if like is None else like
    if ref < 120:
        return f"{s:.1f} s" if ref < 10 else f"{s:.0f} s"
    if ref < 2 * 3600:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h" if ref < 10 * 3600 else f"{s / 3600:.0f} h"


def _num(d: Mapping[str, Any], key: str) -> Optional[float]:
    v = d.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _resume(a: Mapping[str, Any]) -> dict[str, Any]:
    """The incident's resume, where recorded (diagnose/events.py reads it from checkpoint.json)."""
    step = a.get("resumed_step")
    if not isinstance(step, int):
        return {}
    last = a.get("last_step")
    return {"resumed_step": step, "resumed_from": str(a.get("resumed_from") or ""),
            "steps_lost": max(0, last - step) if isinstance(last, int) else None}


def account(submit: float, start: float, end: float, attempts: Sequence[Mapping[str, Any]],
            hang_quiet_s: Optional[float] = None) -> Account:
    """The partition of ``submit`` -> ``end`` (see the module's docstring). Each time is clamped into
    order on a cursor, so clocks that disagree by a little (the supervisor's and the scheduler's) move
    a part's edge, never the total."""
    start = min(max(start, submit), end)
    rows = sorted(attempts, key=lambda a: int(a.get("attempt") or 0))
    if not rows:
        return Account(end - submit, start - submit, 0.0, end - start, 0.0)
    cursor = start

    def at(value: Optional[float]) -> float:
        nonlocal cursor
        cursor = min(max(cursor, value if value is not None else cursor), end)
        return cursor

    startup = productive = 0.0
    incidents: list[Incident] = []
    had_checkpoint = False
    pending: Optional[dict[str, Any]] = None  # the incident whose restart the next attempt ends
    for a in rows:
        before = cursor
        launched = at(_num(a, "launched") or _num(a, "started"))
        line = at(_num(a, "first_line"))
        if pending is None:
            startup += line - before
        else:
            gap = launched - before
            health = min(gap, _num(a, "health_s") or 0.0)  # the gate ran before this attempt
            pending["health_s"] = health
            pending["restart_s"] = gap - health + (line - launched)
            incidents.append(Incident(**pending))
            pending = None
        klass = a.get("class")
        stop = at(_num(a, "fault") or _num(a, "ended") or end)
        run = stop - line
        if not klass:
            productive += run
            at(_num(a, "ended"))
            continue
        # the hang watch fires after the ranks were quiet this long (hang.json's quiet_s): that much of
        # the attempt was already lost when it was detected (older records lack found_by: a hang is the watch's)
        watched = a.get("found_by") == "hang-watch" or (klass == "hang" and not a.get("found_by"))
        detection = min(run, hang_quiet_s or 0.0) if watched else 0.0
        recompute, known = 0.0, False
        ckpt_t = _num(a, "checkpoint_time")
        if ckpt_t is not None:
            recompute, known = max(0.0, min(run - detection, stop - detection - max(ckpt_t, line))), True
        elif "checkpoint_step" in a and a.get("checkpoint_step") is None and not had_checkpoint:
            recompute, known = run - detection, True  # nothing saved yet: the next attempt redoes it all
        had_checkpoint = had_checkpoint or a.get("checkpoint_step") is not None
        productive += run - detection - recompute
        ended = at(_num(a, "ended"))
        pending = {"attempt": int(a.get("attempt") or 0), "klass": str(klass), "found_by": str(a.get("found_by") or ""),
                   "fault": stop, "detection_s": detection, "teardown_s": ended - stop, "health_s": 0.0,
                   "recompute_s": recompute, "recompute_known": known, **_resume(a)}
    if pending is not None:  # the last attempt failed: no restart follows
        incidents.append(Incident(**pending))
    return Account(end - submit, start - submit, startup, productive, end - cursor, tuple(incidents))
