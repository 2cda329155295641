"""Sweeps: a grid of parameters run as ONE array job, each task tracked and summarised.

>>> sweep = Sweep(["examples/mnist_ddp.py", "--lr", "{lr}", "--seed", "{seed}"],
...               grid={"lr": [0.5, 1.0], "seed": [1, 2]}, parallel=2, scheduler="slurm", nodes=2)
>>> handle = sweep.submit()            # one array job; DIR/sweep.json maps task index -> parameters
>>> [t.result() for t in handle.tasks()]   # each task's last ``RESULT {json}`` line

Task ``i`` runs the program with ``{NAME}`` replaced by its value (in the task itself,
argument by argument: a value reaches the program exactly) and ``{index}`` by ``i``.
``torchhpc sweep status|report DIR`` reads the manifest back.
"""

from __future__ import annotations

import contextlib
import csv
import io
import itertools
import json
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from torchhpc.core.array import last_result
from torchhpc.core.handle import Handle
from torchhpc.core.spec import JobSpec
from torchhpc.errors import SchedulerError, SpecError, UnknownJob, UsageError
from torchhpc.job import Job, JobHandle, TaskHandle, check_program, tasks_of
from torchhpc.jobdir.layout import RECORD
from torchhpc.jobdir.logs import TASK_END_LINE, TASK_PREFIX
from torchhpc.schedulers import get_scheduler
from torchhpc.schedulers.api import JobStatus, Scheduler, Submission

__all__ = ["MANIFEST", "Sweep", "SweepHandle", "TaskHandle", "grid_rows", "last_result", "parse_grid", "task_rows"]

MANIFEST = "sweep.json"


def parse_grid(items: Sequence[str]) -> list[tuple[str, list[str]]]:
    """``["lr=0.5,1.0", "seed=1,2"]`` -> ``[("lr", ["0.5", "1.0"]), ("seed", ["1", "2"])]``."""
    out: list[tuple[str, list[str]]] = []
    for item in items:
        name, sep, values = item.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise UsageError(f"--grid {item[:60]!r} is not NAME=V1,V2,...", "e.g. --grid lr=1e-3,3e-4 (NAME: letters, digits, _)")
        if name == "index" or name in dict(out):
            raise UsageError(f"--grid {name} is given twice or is the reserved name 'index'", "one --grid per name")
        out.append((name, _values(name, values)))
    if not out:
        raise UsageError("a sweep needs at least one --grid NAME=V1,V2", "e.g. torchhpc sweep --grid lr=0.5,1.0 -- train.py --lr {lr}")
    return out


def _values(name: str, text: str) -> list[str]:
    """``a,b`` -> ["a", "b"]; a JSON list (``["a,b", 1e-3]``) for values holding commas."""
    if not text.startswith("["):
        return text.split(",")
    try:
        values = json.loads(text)
    except ValueError as e:
        raise UsageError(f"--grid {name}: {text[:60]!r} is not a JSON list ({e})", 'e.g. --grid \'tag=["a,b", "c"]\'') from None
    if not isinstance(values, list) or not values or not all(isinstance(v, (str, int, float)) for v in values):
        raise UsageError(f"--grid {name}: give a non-empty JSON list of strings or numbers", 'e.g. --grid \'tag=["a,b", "c"]\'')
    return [v if isinstance(v, str) else json.dumps(v) for v in values]


def grid_rows(grid: Sequence[tuple[str, Sequence[object]]]) -> list[dict[str, str]]:
    """Every combination, the last name varying fastest (task 0 = all first values)."""
    names = [n for n, _ in grid]
    return [dict(zip(names, (str(v) for v in combo))) for combo in itertools.product(*(vals for _, vals in grid))]


def sweep_spec(spec: JobSpec, grid: Sequence[tuple[str, Sequence[object]]], parallel: Optional[int]) -> JobSpec:
    rows = grid_rows(grid)
    if parallel is not None and parallel < 1:
        raise SpecError(f"--array-parallelism {parallel} must be at least 1")
    array = f"0-{len(rows) - 1}" + (f"%{parallel}" if parallel else "")
    params = tuple((name, tuple(row[name] for row in rows)) for name, _ in grid)
    return spec.with_(array=array, array_params=params)


def flat_metrics(result: Optional[Mapping[str, Any]]) -> dict[str, Any]:
    """Scalars of a RESULT, plus those of the last element of a list of records (``epochs[-1].accuracy``)."""
    out: dict[str, Any] = {}
    for key, value in (result or {}).items():
        if isinstance(value, (int, float, str, bool)) or value is None:
            out[key] = value
        elif isinstance(value, list) and value and isinstance(value[-1], dict):
            out.update({k: v for k, v in value[-1].items() if isinstance(v, (int, float, str, bool))})
    return out


@dataclass
class SweepHandle(JobHandle):
    directory: str

    def tasks(self) -> list[TaskHandle]:
        man = read_manifest(self.directory)
        return tasks_of(self.scheduler, self.job_id, [t["index"] for t in man["tasks"]])

    def rows(self) -> list[dict[str, Any]]:
        return task_rows(self.directory)


class Sweep:
    """A grid of parameters over one program, as one array job (the ``torchhpc sweep`` command)."""

    def __init__(self, program: Sequence[str] | JobSpec, *, grid: Mapping[str, Sequence[object]],
                 parallel: Optional[int] = None, **job: Any) -> None:
        base = Job(program, **job) if not isinstance(program, JobSpec) else Job(program)
        self.spec = sweep_spec(base.spec, list(grid.items()), parallel)
        self.scheduler = get_scheduler(self.spec.scheduler, runner=base.scheduler.runner)

    def render(self) -> Submission:
        return self.scheduler.render(self.spec)

    def manifest(self) -> dict[str, Any]:
        return manifest(self.spec)

    def submit(self) -> SweepHandle:
        check_program(self.spec)
        check_manifest_free(self.spec.output_dir)
        sub = self.render()
        job_id = self.scheduler.start(sub)
        d = os.path.abspath(self.spec.output_dir)
        write_manifest(d, {**self.manifest(), "job_id": job_id, "handle": str(Handle(self.spec.scheduler, job_id))})
        return SweepHandle(self.scheduler, job_id, d)


def manifest(spec: JobSpec) -> dict[str, Any]:
    arr = spec.array_spec
    assert arr is not None
    return {
        "scheduler": spec.scheduler, "name": spec.name, "array": spec.array, "created": time.time(),
        "params": [name for name, _ in spec.array_params],
        "program": [spec.entrypoint.target, *spec.entrypoint.args],
        "tasks": [{"index": i, "params": {n: vals[pos] for n, vals in spec.array_params}}
                  for pos, i in enumerate(arr.indices)],
    }


def check_manifest_free(directory: str) -> None:
    """Before submitting: a directory that already holds a sweep's manifest is another sweep (or the user's)."""
    path = os.path.join(os.path.abspath(directory), MANIFEST)
    if os.path.lexists(path):
        raise UsageError(
            f"--output-dir {directory} already holds {MANIFEST}: torchhpc never writes over an existing file",
            "give a new --output-dir (or none: a fresh NAME-sweep-TIMESTAMP/ is made)",
        )


def free_directory(base: str) -> str:
    """``base``, or ``base-2``, ``base-3``... : the first name nothing has (a default must not join a user's directory)."""
    name, n = base, 1
    while os.path.lexists(name):
        n += 1
        name = f"{base}-{n}"
    return name


def write_manifest(directory: str, data: Mapping[str, Any]) -> str:
    """Write ``sweep.json`` whole, as a new file: an existing one is never replaced."""
    from torchhpc.jobdir.files import keep, write_new

    path = os.path.join(directory, MANIFEST)
    written = write_new([(path, json.dumps(data, indent=1))], private=True)
    if keep(written.paths[path], path) != path:
        written.remove()
        check_manifest_free(directory)
    return path


def read_manifest(directory: str) -> dict[str, Any]:
    path = os.path.join(directory, MANIFEST)
    try:
        with open(path) as f:
            data: dict[str, Any] = json.load(f)
    except (OSError, ValueError) as e:
        raise UsageError(f"no sweep manifest {path!r} ({e})", "give the --output-dir of a `torchhpc sweep`") from None
    return data


def task_rows(directory: str) -> list[dict[str, Any]]:
    """One row per task: index, parameters, state, exit code, restarts, elapsed, RESULT metrics."""
    man = read_manifest(directory)
    sched = get_scheduler(man["scheduler"])
    job_id = str(man.get("job_id") or "")
    if not job_id:
        raise UsageError(f"the sweep in {directory!r} was never submitted (a dry run?)", "submit it: torchhpc sweep ...")
    try:
        overall = sched.status(job_id)
        shared = _shared_log(sched, job_id, [t["index"] for t in man["tasks"]])
    except UnknownJob:
        # forgotten by the store (`list --prune`): the job's own directory beside the manifest still holds it
        found = _kept(directory, man, job_id)
        if found is None:
            raise
        overall, shared = found
    by_id = {t.job_id: t for t in overall.tasks}
    rows = []
    for task in man["tasks"]:
        i = task["index"]
        tid = f"{job_id}_{i}"
        st = by_id.get(tid) or _local_task(shared, tid, i, overall)
        result = None
        if sched.task_id(job_id, i) is not None:  # a task with its own logs (a Slurm array task)
            with contextlib.suppress(SchedulerError):
                result = last_result(sched.logs(tid))
        elif shared is not None:  # one log, each line [task I]-prefixed (the local scheduler)
            result = last_result(shared.get(i, ""))
        row: dict[str, Any] = {"task": i, **task["params"]}
        row.update(state=st.state if st else overall.state, exit_code=st.exit_code if st else None,
                   restarts=st.restarts if st else 0, elapsed=st.elapsed if st else "")
        row.update({f"result.{k}": v for k, v in flat_metrics(result).items()})
        rows.append(row)
    return rows


def _by_task(text: str) -> dict[int, str]:
    """task -> its lines of a log that holds every task's behind ``[task I]`` (jobdir/logs.py's grammar)."""
    out: dict[int, list[str]] = {}
    for line in text.splitlines():
        m = TASK_PREFIX.match(line)
        if m:
            out.setdefault(int(m.group(1)), []).append(line[m.end():])
    return {i: "\n".join(lines) for i, lines in out.items()}


def _shared_log(sched: Scheduler, job_id: str, indices: Sequence[int]) -> Optional[dict[int, str]]:
    """task -> its lines of a log that holds every task's, ``[task I]``-prefixed (the local scheduler's
    array); None where each task has its own (Slurm, PBS) or the log cannot be read."""
    if not indices or sched.task_id(job_id, indices[0]) is not None:
        return None
    try:
        text = sched.logs(job_id)
    except SchedulerError:
        return None
    return _by_task(text)


def _kept(directory: str, man: Mapping[str, Any], job_id: str) -> Optional[tuple[JobStatus, dict[int, str]]]:
    """(the job's end, task -> its lines) from the job's own directory in the sweep's (``NAME-ID/``: its
    record and its log, which the local store only links to); None where there is none."""
    home = os.path.join(directory, f"{man.get('name')}-{job_id}")
    try:
        with open(os.path.join(home, RECORD), encoding="utf-8") as f:
            rec = json.load(f)
        with open(os.path.join(home, "output.log"), encoding="utf-8", errors="replace") as f:
            text = f.read()
    except (OSError, ValueError):
        return None
    overall = JobStatus(job_id=job_id, state=str(rec.get("state", "UNKNOWN")), exit_code=rec.get("exit_code"),
                        reason=str(rec.get("reason", "")), name=str(rec.get("name", "")), nodes="localhost")
    return overall, _by_task(text)


def _local_task(shared: Optional[Mapping[int, str]], tid: str, index: int, overall: JobStatus) -> Optional[JobStatus]:
    """One task's end from its own ``torchhpc: task I ended STATE, exit N, after S s`` line (local/array.py);
    None while it has not ended (the job's state is then the row's)."""
    for line in reversed((shared or {}).get(index, "").splitlines()):
        m = TASK_END_LINE.match(line)
        if m:
            return JobStatus(job_id=tid, state=m.group(2), exit_code=int(m.group(3)), elapsed=f"{float(m.group(4)):.1f}s",
                             name=overall.name, nodes=overall.nodes)
    return None


def columns(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    return list(dict.fromkeys(k for r in rows for k in r))


def markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    cols = columns(rows)
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(str(r.get(c, "")).replace("|", "\\|") for c in cols) + " |" for r in rows]
    return "\n".join(out) + "\n"


def to_csv(rows: Sequence[Mapping[str, Any]]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns(rows))
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def report(directory: str, metric: Optional[str] = None, param: Optional[str] = None) -> dict[str, str]:
    """Write report.md, report.csv and (with matplotlib) report.png (metric vs parameter); return the paths."""
    rows = task_rows(directory)
    man = read_manifest(directory)
    paths = {"md": os.path.join(directory, "report.md"), "csv": os.path.join(directory, "report.csv")}
    with open(paths["md"], "w") as f:
        f.write(f"# Sweep {man.get('handle', '')}: {man.get('name', '')}\n\n" + markdown(rows))
    with open(paths["csv"], "w", newline="") as f:
        f.write(to_csv(rows))
    numeric = [c for c in columns(rows) if c.startswith("result.") and any(isinstance(r.get(c), (int, float)) for r in rows)]
    metric = metric or ("result.accuracy" if "result.accuracy" in numeric else (numeric[0] if numeric else None))
    if metric and not metric.startswith("result."):
        metric = "result." + metric
    param = param or (man["params"][0] if man.get("params") else None)
    if metric and param:
        png = _plot(rows, metric, param, os.path.join(directory, "report.png"))
        if png:
            paths["png"] = png
    return paths


def no_png_reason(rows: Sequence[Mapping[str, Any]], metric: Optional[str] = None) -> str:
    """Why :func:`report` wrote no report.png, as observed: no numeric RESULT metric in any task's log,
    or no matplotlib to draw it with."""
    numeric = [c for c in columns(rows) if c.startswith("result.") and any(isinstance(r.get(c), (int, float)) for r in rows)]
    if metric and ("result." + metric.removeprefix("result.")) not in numeric:
        return f"no task's RESULT line has a numeric {metric.removeprefix('result.')!r}"
    if not numeric:
        return "no task printed a RESULT line with a number (print('RESULT ' + json.dumps({...})))"
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "matplotlib is not installed"
    return "no task has both the parameter and the metric as numbers"


def _plot(rows: Sequence[Mapping[str, Any]], metric: str, param: str, path: str) -> Optional[str]:
    from torchhpc.core.plot import pyplot

    try:
        plt = pyplot()
    except UsageError:
        return None
    pts = []
    for r in rows:
        try:
            pts.append((float(r[param]), float(r[metric])))
        except (KeyError, TypeError, ValueError):
            continue
    if not pts:
        return None
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.scatter([p[0] for p in pts], [p[1] for p in pts])
    ax.set_xlabel(param)
    ax.set_ylabel(metric.removeprefix("result."))
    ax.set_title(f"{metric.removeprefix('result.')} vs {param} ({len(pts)} tasks)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
