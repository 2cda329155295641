"""What a job waits for: its dependencies with their jobs' states, and the local supervisor's wait.

:func:`job_dependencies` is the small function ``status`` (and the pending explanation) calls:
the dependencies recorded when the job was submitted, each with its job's state and a verdict
(``waiting``, ``satisfied``, ``never``; :func:`torchhpc.core.depend.verdict`). The states come
from the scheduler's :meth:`~torchhpc.schedulers.api.Scheduler.query_many`, its one question about
several jobs at once (Slurm: one ``squeue`` call for the id list, ``sacct`` only for the ids the
controller has forgotten).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Optional

from torchhpc.core.depend import Dependency, verdict
from torchhpc.errors import TorchHPCError
from torchhpc.jobdir.record import load_record
from torchhpc.schedulers.api import TERMINAL, Scheduler

__all__ = ["DependencyState", "job_dependencies", "recorded_dependencies", "wait_dependencies"]



@dataclass(frozen=True)
class DependencyState:
    """One dependency of a job, its job's state now and whether it is met (``waiting``/``satisfied``/``never``)."""

    dependency: Dependency
    handle: str
    state: str
    verdict: str
    exit_code: Optional[int] = None

    def line(self) -> str:
        """``after-ok slurm:123: FAILED (exit 1): never satisfied``."""
        code = f" (exit {self.exit_code})" if self.exit_code not in (None, 0) else ""
        what = {"waiting": "waiting", "satisfied": "satisfied", "never": "never satisfied"}[self.verdict]
        return f"{self.dependency.flag[2:]} {self.handle}: {self.state}{code}: {what}"


def recorded_dependencies(scheduler: str, job_id: str) -> tuple[Dependency, ...]:
    """The dependencies the job was submitted with (its record's ``after``), () when none or unknown."""
    rec = load_record(scheduler, job_id)
    out: list[Dependency] = []
    for item in (rec.extra.get("after") if rec is not None else None) or []:
        try:
            kind, dep_id = item
            out.append(Dependency(kind, str(dep_id)))
        except (TypeError, ValueError, TorchHPCError):  # a hand-edited record: no dependency rather than no status
            continue
    return tuple(out)


def dependency_states(scheduler: Scheduler, deps: Sequence[Dependency]) -> list[DependencyState]:
    """Each dependency with its job's state (``UNKNOWN`` when it cannot be asked) and verdict."""
    known = scheduler.query_many([d.job_id for d in deps])  # one squeue (Slurm) or qstat (PBS) for all
    out = []
    for dep in deps:
        st = known.get(dep.job_id)
        state = st.state if st is not None else "UNKNOWN"
        code = st.exit_code if st is not None else None
        out.append(DependencyState(dep, dep.handle(scheduler.name), state,
                                   verdict(dep, state, code, ended=state in TERMINAL), code))
    return out


def job_dependencies(scheduler: Scheduler, job_id: str) -> list[DependencyState]:
    """What job ``job_id`` waits for (or waited for): its recorded dependencies with their states now."""
    deps = recorded_dependencies(scheduler.name, job_id)
    return dependency_states(scheduler, deps) if deps else []


def wait_dependencies(
    scheduler: Scheduler,
    deps: Sequence[Dependency],
    *,
    poll: float = 0.5,
    progress: Callable[[list[DependencyState]], None] | None = None,
) -> list[DependencyState]:
    """Wait until every dependency is met (returns []) or one never can be (returns those).

    The local supervisor's wait: its jobs' ends are files on this machine, so polling is cheap.
    """
    last: list[str] = []
    while True:
        states = dependency_states(scheduler, deps)
        never = [s for s in states if s.verdict == "never"]
        if never or all(s.verdict == "satisfied" for s in states):
            return never
        lines = [s.line() for s in states]
        if progress is not None and lines != last:
            progress(states)
        last = lines
        time.sleep(poll)
