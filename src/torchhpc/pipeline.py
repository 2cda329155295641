"""Pipelines: named steps, each a job, submitted at once with native dependencies between them.

A :class:`Step` is a name, a :class:`~torchhpc.core.spec.JobSpec` and the names of the steps it
comes after (``after`` = after-ok, ``after_any``, ``after_fail``). :func:`check` refuses unknown
names, cycles and dependencies across schedulers, one line each, before anything is submitted.
:func:`submit` sends every step in dependency order, each with its parents' job ids as its
dependencies (Slurm ``--dependency``, PBS ``-W depend``, the local supervisor's wait), so that
no client has to stay alive, and writes the pipeline's record: a small JSON file in the output
directory, found again by the pipeline file, the record's path or the pipeline id
(:func:`find_record`). ``status`` asks each scheduler once for all its steps
(:meth:`~torchhpc.schedulers.api.Scheduler.query_many`); ``cancel`` stops a step and every step after it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

from torchhpc.core.depend import Dependency, verdict
from torchhpc.core.spec import JobSpec
from torchhpc.errors import ConfigError, TorchHPCError
from torchhpc.jobdir.record import record_dir
from torchhpc.schedulers import get_scheduler, scheduler_class
from torchhpc.schedulers.api import TERMINAL, JobStatus, Submission

__all__ = ["STEP_NAME", "PipelineRecord", "Step", "StepRow", "cancel", "check", "find_record", "render", "rows", "submit"]

SUFFIX = ".pipeline.json"
# a step's keys for its dependencies, by kind (core/depend.py)
STEP_KEYS = {"ok": "after", "any": "after_any", "fail": "after_fail"}
# A step's name becomes its job's name, a column of the status table, the word `pipeline logs FILE STEP`
# takes and, in a dry run, the ``<STEP>`` that stands for its job id: ASCII letters, digits, '_', '.', '-'
# (what every scheduler's job name, a shell word and the dependency placeholder carry unchanged).
STEP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
STEP_NAME_RULE = "1-63 ASCII letters, digits, '_', '.' or '-', starting with a letter or digit"


def name_problem(name: str, source: str) -> str | None:
    """The line that refuses step ``name`` (None when it is a good name): it names the step and the rule."""
    if STEP_NAME.fullmatch(name):
        return None
    return f"{source}: step {name!r}: a step's name is {STEP_NAME_RULE} (rename it, and the after = [...] naming it)"


@dataclass(frozen=True)
class Step:
    """One step: its job, and the steps it waits for by kind (``ok``/``any``/``fail`` -> names)."""

    name: str
    spec: JobSpec
    after: tuple[tuple[str, str], ...] = ()  # (kind, step name)


def check(steps: Sequence[Step], source: str = "pipeline") -> list[Step]:
    """The steps in an order that submits every parent first; each problem is one line of one error."""
    graph = {s.name: list(s.after) for s in steps}
    problems, order = check_graph(graph, {s.name: s.spec.scheduler for s in steps}, source)
    if problems:
        raise ConfigError("\n".join(problems), "fix the lines above; nothing was submitted")
    by_name = {s.name: s for s in steps}
    return [by_name[n] for n in order]


def check_graph(
    graph: Mapping[str, Sequence[tuple[str, str]]], schedulers: Mapping[str, str | None], source: str
) -> tuple[list[str], list[str]]:
    """Problems (one line each: unknown names, a step after itself, across schedulers, a cycle) and
    an order of the names that puts every parent first. ``schedulers``: None where unknown."""
    problems: list[str] = [p for p in (name_problem(n, source) for n in graph) if p]
    names = set(graph)
    for name, after in graph.items():
        for kind, parent in after:
            key = STEP_KEYS[kind]
            if parent not in names:
                problems.append(f"{source}: step {name}: {key} names {parent!r}, which is no step "
                                f"(steps: {', '.join(sorted(names))})")
            elif parent == name:
                problems.append(f"{source}: step {name}: {key} names the step itself")
            elif None not in (schedulers.get(parent), schedulers.get(name)) and schedulers[parent] != schedulers[name]:
                problems.append(f"{source}: step {name} ({schedulers[name]}) cannot wait for step {parent} "
                                f"({schedulers[parent]}): dependencies stay within one scheduler")
    parents = {n: [p for _, p in after if p in names and p != n] for n, after in graph.items()}
    order: list[str] = []
    pending = list(graph)
    while pending:
        ready = [n for n in pending if all(p in order for p in parents[n])]
        if not ready:
            cycle = _cycle({n: parents[n] for n in pending})
            problems.append(f"{source}: the steps {' -> '.join(cycle)} wait for each other in a cycle")
            break
        order += ready
        pending = [n for n in pending if n not in ready]
    return problems, order


def _cycle(graph: Mapping[str, list[str]]) -> list[str]:
    """One cycle of ``graph`` (every node in it has a parent in it), as names with the first repeated."""
    start = next(iter(graph))
    seen: list[str] = [start]
    node = start
    while True:
        node = graph[node][0]
        if node in seen:
            return [*seen[seen.index(node):], node]
        seen.append(node)


def _with_parents(step: Step, ids: Mapping[str, str]) -> JobSpec:
    deps = tuple(Dependency(kind, ids[parent]) for kind, parent in step.after)  # type: ignore[arg-type]
    return step.spec.with_(after=(*step.spec.after, *deps))


def render(steps: Sequence[Step]) -> list[tuple[Step, Submission]]:
    """Every step's render (the dry run), a step not submitted yet standing as ``<name>`` for its job id."""
    order = check(steps)
    out = []
    for step in order:
        spec = _with_parents(step, {s.name: f"<{s.name}>" for s in steps})
        sub = get_scheduler(spec.scheduler).render(spec)
        if step.after:
            sub = replace(sub, notes=(*sub.notes, "<STEP> stands for that step's job id, known once it is submitted"))
        out.append((step, sub))
    return out


@dataclass
class PipelineRecord:
    """What ``pipeline status|cancel|logs`` need: each step's scheduler, job id and parents."""

    id: str
    name: str
    file: str
    path: str = ""
    submitted: float = 0.0
    steps: list[dict[str, Any]] = field(default_factory=list)

    def step(self, name: str) -> dict[str, Any]:
        for s in self.steps:
            if s["name"] == name:
                return s
        raise ConfigError(f"pipeline {self.id} has no step {name!r}",
                          f"its steps: {', '.join(s['name'] for s in self.steps)}")

    def to_json(self) -> dict[str, Any]:
        return {"schema": 1, **{k: v for k, v in asdict(self).items() if k != "path"}}  # the path is where it lies


def submit(steps: Sequence[Step], *, name: str, file: str = "", directory: str = ".") -> PipelineRecord:
    """Submit every step, parents first, each with its parents' ids as native dependencies.

    A submission that fails half-way cancels the steps already submitted (a pipeline is whole or
    not at all) and raises.
    """
    from torchhpc.job import check_gpus, check_program

    order = check(steps)
    for step in order:  # what `torchhpc run` refuses before it submits, for every step before the first
        check_program(step.spec)
        check_gpus(step.spec, get_scheduler(step.spec.scheduler).runner)
    rec = PipelineRecord(id=time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:4], name=name,
                         file=os.path.abspath(file) if file else "", submitted=time.time())
    ids: dict[str, str] = {}
    try:
        for step in order:
            spec = _with_parents(step, ids)
            scheduler = get_scheduler(spec.scheduler)
            sub = scheduler.render(spec)
            job_id = scheduler.start(sub)
            ids[step.name] = job_id
            rec.steps.append({"name": step.name, "scheduler": spec.scheduler, "job_id": job_id,
                              "after": [[k, n] for k, n in step.after]})
    except BaseException:
        for s in reversed(rec.steps):
            with contextlib.suppress(TorchHPCError):
                get_scheduler(s["scheduler"]).cancel(s["job_id"])
        raise
    order_names = [s.name for s in steps]  # the table keeps the file's order
    rec.steps.sort(key=lambda s: order_names.index(s["name"]))
    _save(rec, directory)
    return rec


def _index_dir() -> Path:
    return record_dir().parent / "pipelines"


def _save(rec: PipelineRecord, directory: str) -> None:
    """The record in the output directory, and a pointer to it under the state directory (for the id)."""
    rec.path = os.path.abspath(os.path.join(directory, f"{rec.name}-{rec.id}{SUFFIX}"))
    os.makedirs(os.path.dirname(rec.path), exist_ok=True)
    with open(rec.path, "x") as f:
        json.dump(rec.to_json(), f, indent=1)
    with contextlib.suppress(OSError):  # a read-only state directory: the record is still found by its path
        _index_dir().mkdir(parents=True, exist_ok=True)
        (_index_dir() / f"{rec.id}.json").write_text(json.dumps({"path": rec.path, "file": rec.file}))


def _load(path: str) -> PipelineRecord:
    try:
        data = json.loads(Path(path).read_text())
        return PipelineRecord(id=str(data["id"]), name=str(data["name"]), file=str(data.get("file", "")),
                              path=os.path.abspath(path), submitted=float(data.get("submitted", 0)),
                              steps=list(data["steps"]))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"cannot read the pipeline record {path}: {e}",
                          "torchhpc pipeline FILE.toml writes it; give that file, the record or its id") from None


def find_record(what: str) -> PipelineRecord:
    """A pipeline by its record (``*.pipeline.json``), its TOML file (the newest submission of it) or its id."""
    if what.endswith(SUFFIX) and os.path.isfile(what):
        return _load(what)
    index = sorted(_index_dir().glob("*.json")) if _index_dir().is_dir() else []
    if what.endswith(".toml"):
        wanted = os.path.abspath(what)
        for entry in reversed(index):  # ids start with the time: the newest first
            try:
                pointer = json.loads(entry.read_text())
            except (OSError, ValueError):
                continue
            if pointer.get("file") == wanted and os.path.isfile(str(pointer.get("path", ""))):
                return _load(str(pointer["path"]))
        raise ConfigError(f"{what} has not been submitted from here (no pipeline record names it)",
                          f"submit it with `torchhpc pipeline {what}`, or give the record's path or the pipeline id")
    entry = _index_dir() / f"{what}.json"
    if "/" not in what and entry.is_file():
        with contextlib.suppress(OSError, ValueError, KeyError):
            return _load(str(json.loads(entry.read_text())["path"]))
    raise ConfigError(f"no pipeline {what!r} here", "give the pipeline's .toml file, its .pipeline.json record or its id")


@dataclass
class StepRow:
    """One line of the step table."""

    step: str
    handle: str
    state: str  # the job's state, or NEVER when a dependency can never be met
    after: str
    detail: str = ""
    status: Optional[JobStatus] = None


def rows(rec: PipelineRecord) -> list[StepRow]:
    """The step table: one query per scheduler for all its steps, dependencies judged from those answers."""
    by_sched: dict[str, list[str]] = {}
    for s in rec.steps:
        by_sched.setdefault(s["scheduler"], []).append(s["job_id"])
    known = {(sched, job_id): answer for sched, ids in by_sched.items()
             for job_id, answer in get_scheduler(sched).query_many(ids).items()}
    steps = {s["name"]: s for s in rec.steps}
    out = []
    for s in rec.steps:
        st = known.get((s["scheduler"], s["job_id"]))
        state = st.state if st is not None else "UNKNOWN"
        detail = "" if st is not None else ("record gone: `torchhpc list --prune` forgets ended local jobs"
                                            if scheduler_class(s["scheduler"]).runs_here else
                                            "its scheduler no longer knows it")
        if st is not None and st.exit_code not in (None, 0) and st.terminal:
            detail = f"exit {st.exit_code}"
        if state not in ("RUNNING", "COMPLETED"):
            never, waiting = [], []
            for kind, parent in s.get("after", []):
                pst = known.get((steps[parent]["scheduler"], steps[parent]["job_id"]))
                pstate = pst.state if pst is not None else None
                v = verdict(Dependency(kind, "0"), pstate, pst.exit_code if pst else None, ended=pstate in TERMINAL)
                if v == "never":
                    never.append(f"{parent} {pstate}")
                elif v == "waiting":
                    waiting.append(parent)
            # Ended by its dependency (Slurm's kill-on-invalid-dep, the local supervisor: that reason), or still
            # held by one that can never be met. A step cancelled otherwise (by the user) stays CANCELLED.
            by_dependency = st is not None and st.reason == "DependencyNeverSatisfied"
            if never and (state in ("PENDING", "UNKNOWN") or by_dependency):
                state, detail = "NEVER", "after " + ", ".join(never)
            elif never and state == "CANCELLED" and (st is None or not st.reason):
                detail = "after " + ", ".join(never)  # which, the controller no longer says (sacct keeps no reason)
            elif waiting and state == "PENDING":
                detail = "waits for " + ", ".join(waiting)
        after = ", ".join(("" if k == "ok" else f"{k}:") + n for k, n in s.get("after", [])) or "-"
        out.append(StepRow(s["name"], f"{s['scheduler']}:{s['job_id']}", state, after, detail, st))
    return out


def table(rows_: Sequence[StepRow]) -> str:
    """``STEP JOB STATE AFTER``, aligned; a state's detail in parentheses."""
    lines = [("STEP", "JOB", "STATE", "AFTER")]
    lines += [(r.step, r.handle, r.state + (f" ({r.detail})" if r.detail else ""), r.after) for r in rows_]
    widths = [max(len(line[i]) for line in lines) for i in range(3)]
    return "\n".join(
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(line[:3])) + "  " + line[3] for line in lines
    ) + "\n"


def descendants(rec: PipelineRecord, name: str) -> list[str]:
    """``name`` and every step after it (any kind), each once, children after their parents."""
    rec.step(name)
    out = [name]
    changed = True
    while changed:
        changed = False
        for s in rec.steps:
            if s["name"] not in out and any(p in out for _, p in s.get("after", [])):
                out.append(s["name"])
                changed = True
    return out


def cancel(rec: PipelineRecord, step: str | None = None) -> list[tuple[str, str]]:
    """Cancel ``step`` and every step after it (all steps without one): the last ones first, so that
    no after-any or after-fail step starts in between. Returns (step, what happened) pairs."""
    names = descendants(rec, step) if step else [s["name"] for s in rec.steps]
    current = {r.step: r for r in rows(rec)}
    out = []
    for name in reversed(names):
        s = rec.step(name)
        row = current.get(name)
        if row is not None and row.status is not None and row.status.terminal:
            out.append((name, f"had already ended ({row.status.state})"))
            continue
        try:
            get_scheduler(s["scheduler"]).cancel(s["job_id"])
            out.append((name, "cancelled"))
        except TorchHPCError as e:
            out.append((name, f"not cancelled: {e.message}"))
    return list(reversed(out))


def logs(rec: PipelineRecord, step: str, rank: int | None = None) -> str:
    """One step's log (one rank's lines with ``rank``), as ``torchhpc logs`` of its job prints it."""
    s = rec.step(step)
    return get_scheduler(s["scheduler"]).logs(s["job_id"], rank=rank)
