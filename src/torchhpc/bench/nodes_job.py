"""The login-node side of ``torchhpc bench nodes``: one job, its progress, its verdict.

The job is an ordinary :class:`~torchhpc.core.spec.JobSpec` whose ranks run
``python -m torchhpc.bench.nodes`` (see :mod:`torchhpc.bench.nodes`), rendered
and submitted by the scheduler like any training job (sbatch, qsub, or the
local foreground run for a one-node smoke test). Inside a Slurm allocation
(``salloc``) the same rendered script runs as steps of that allocation.
While it runs, the job log's ``bench-nodes:`` lines are relayed as progress;
at the end rank 0's JSON becomes the verdict table.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchhpc.bench import nodes_plan as plan
from torchhpc.core import hostlist
from torchhpc.core.handle import Handle
from torchhpc.core.spec import Entrypoint, JobSpec
from torchhpc.core.units import counted, plural
from torchhpc.errors import JobFailed, UsageError
from torchhpc.schedulers import scheduler_class

__all__ = ["NodesRun", "make_spec", "run_job", "slow_links", "summary", "write_outputs"]

WORKER = "torchhpc.bench.nodes"
RESERVE_SECONDS = 20.0  # of the budget, kept for ending the job and collecting the result


@dataclass
class NodesRun:
    job: str
    report: dict[str, Any]
    seconds: float

    @property
    def rows(self) -> list[plan.Row]:
        return [plan.Row(**r) for r in self.report["rows"]]


def resolve_nodes(scheduler: Any, nodes: int | None, nodelist: str | None,
                  env: dict[str, str] | None = None) -> tuple[int, list[str] | None, bool]:
    """(node count, explicit node names or None, inside an allocation)."""
    env = dict(os.environ) if env is None else env
    name = scheduler.name
    if nodelist:
        if not scheduler.accepts_nodelist:
            raise UsageError(f"--nodelist with the {name} scheduler",
                             "--nodelist is a Slurm option; on PBS give --nodes N (select picks the nodes)")
        names = hostlist.expand(nodelist)
        known = scheduler.node_names()
        unknown = [n for n in names if known and n not in known]
        if unknown:
            raise UsageError(f"--nodelist {nodelist}: {', '.join(unknown)} is not a node of this cluster",
                             f"`sinfo -N` lists {hostlist.compress(known)}")
        if nodes is not None and nodes != len(names):
            raise UsageError(f"--nodes {nodes} but --nodelist {nodelist} names {counted(len(names), 'node')}",
                             "give one of them")
        return len(names), names, False
    alloc = scheduler.allocation_of("", env)  # salloc, an sbatch script, a PBS job: the nodes it holds
    allocated = alloc.nodes() if nodes is None and alloc.inside() else None
    if allocated:
        return len(allocated), allocated, True
    n = 1 if nodes is None else nodes
    if not scheduler.supports_multi_node and n > 1:
        raise UsageError(f"--nodes {n} with the {name} scheduler (one machine)",
                         "give --scheduler slurm (or pbs) for more nodes; local runs the one-node checks")
    known = scheduler.node_names()
    if known and n > len(known):
        raise UsageError(f"--nodes {n} but this cluster has {counted(len(known), 'node')} ({hostlist.compress(known)})",
                         f"give --nodes {len(known)} or fewer")
    return n, None, False


def make_spec(base: JobSpec, n: int, names: list[str] | None, *, size: int, iters: int, slow_ratio: float,
              budget: float, out_dir: str, deadline: float, stat: str = "best") -> tuple[JobSpec, str]:
    """The job: ``n`` nodes (or exactly ``names``), the worker as its program; returns it and the JSON path."""
    plan.check_budget(budget, n)
    out = os.path.abspath(out_dir)
    json_path = _fresh(os.path.join(out, "bench-nodes.json"))  # an earlier run's result stays (and cannot pass for this one)
    args = ("--size", str(size), "--iters", str(iters), "--slow-ratio", str(slow_ratio), "--stat", stat,
            "--deadline", f"{deadline:.0f}", "--json", json_path)
    options = dict(base.options)
    if names:
        options["nodelist"] = hostlist.compress(names)
    changes: dict[str, Any] = {
        "entrypoint": Entrypoint("module", WORKER, args, base.entrypoint.python),
        "nodes": n,
        "output_dir": out,
        "options": tuple(options.items()),
    }
    if base.time is None and scheduler_class(base.scheduler).supports_time_limit:
        changes["time"] = str(math.ceil(budget / 60) + 1)  # Slurm/PBS stop a stuck run
    return base.with_(**changes), json_path


def _fresh(path: str) -> str:
    """``path``, or ``NAME.N.EXT`` for the first N that no file has: torchhpc never overwrites or deletes one."""
    stem, ext = os.path.splitext(path)
    n, name = 1, path
    while os.path.lexists(name):
        n += 1
        name = f"{stem}.{n}{ext}"
    return name


def _relay(path: str, offset: int, say: Callable[[str], None]) -> int:
    """Print the new ``bench-nodes:`` lines of the job log from ``offset``; returns the new offset."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except OSError:
        return offset
    end = data.rfind(b"\n") + 1
    for line in data[:end].decode(errors="replace").splitlines():
        if plan.PREFIX in line:
            say(line.split(plan.PREFIX, 1)[1])
    return offset + end


def run_job(scheduler: Any, spec: JobSpec, json_path: str, *, budget: float, started: float,
            in_allocation: bool = False, say: Callable[[str], None] = print, poll: float = 1.0) -> NodesRun:
    """Submit (or run in the allocation), relay progress, stop at the budget, read the JSON."""
    Path(spec.output_dir).mkdir(parents=True, exist_ok=True)
    submission = scheduler.render(spec)
    if scheduler.runs_here:
        job = "local:" + scheduler.schedule(submission)  # foreground; the ranks' lines are relayed as they come
        st = scheduler.status(job.split(":", 1)[1])
        if not st.ok:
            raise JobFailed(f"bench nodes run {job} {st.line()}", "its output is above")
        return _finish(job, json_path, started)
    proc = None
    if in_allocation:
        written = submission.write_files()  # beside a file of the same name, never over it
        script = written.paths.get(str(submission.script_path), str(submission.script_path))
        log = _fresh(os.path.join(spec.output_dir, f"{spec.name}-step.out"))
        with open(log, "x") as fh:
            proc = subprocess.Popen(["bash", script], stdout=fh, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        job, logs = f"allocation {os.environ.get('SLURM_JOB_ID', '?')}", [log]
    else:
        job_id = scheduler.schedule(submission)
        job, logs = str(Handle(scheduler.name, job_id)), scheduler.log_paths(job_id)
    say(f"submitted {job}; budget {budget:.0f}s")
    offset, last = 0, ""
    while True:
        if proc is not None:
            rc = proc.poll()
            done, ok, line = rc is not None, rc == 0, f"exit={rc}"
        else:
            st = scheduler.status(job_id)
            done, ok, line = st.terminal, st.ok, st.line()
            if st.state != last:
                say(f"{job} {st.state}")
                last = st.state
        if logs:
            offset = _relay(logs[0], offset, say)
        if done:
            break
        if time.time() > started + budget + 30:
            if proc is not None:
                proc.terminate()
            else:
                scheduler.cancel(job_id)
            raise JobFailed(f"{job} still running {time.time() - started:.0f}s after start (--budget {budget:.0f})",
                            "it was cancelled; give a larger --budget or fewer nodes, and check the queue")
        time.sleep(poll)
    if not ok:
        where = f"; log {logs[0]}" if logs else ""
        raise JobFailed(f"bench nodes job {job} {line}{where}",
                        "the log says which rank failed; `torchhpc doctor` checks a node's setup")
    return _finish(job, json_path, started)


def _finish(job: str, json_path: str, started: float) -> NodesRun:
    for _ in range(20):  # a shared file system may show the file a moment late
        if os.path.exists(json_path):
            break
        time.sleep(0.5)
    try:
        report = json.loads(Path(json_path).read_text())
    except (OSError, ValueError) as e:
        raise JobFailed(f"bench nodes job {job} ended but left no readable {json_path} ({e})",
                        "the output folder must be on a file system the nodes share (--out)") from None
    report["job"] = job
    return NodesRun(job, report, time.time() - started)


def write_outputs(run: NodesRun, json_out: str | None, exclude_file: str | None) -> list[str]:
    """Write ``--json`` and ``--exclude-file``; returns the nodes found SLOW or FAIL."""
    text, bad = plan.exclude_text(run.rows)
    if json_out:
        Path(json_out).write_text(json.dumps({**run.report, "seconds": run.seconds, "exclude": bad}, indent=1))
    if exclude_file:
        Path(exclude_file).write_text(text)
    return bad


def slow_links(run: NodesRun) -> list[str]:
    return [r.node for r in run.rows if r.check == "link" and r.verdict != plan.PASS]


def summary(run: NodesRun, bad: Sequence[str]) -> str:
    r = run.report
    pairs = len(r.get("pairs", []))
    links = slow_links(run)
    verdict = (f"; SLOW/FAIL: {', '.join(bad)}" if bad else "") + (f"; slow {plural(len(links), 'link')}: {', '.join(links)}" if links else "")
    return (f"{counted(len(r['nodes']), 'node')}, {counted(pairs, 'pair measurement')} of {r['size'] / 2**20:g} MiB, "
            f"job {run.job}, {run.seconds:.0f}s in all" + (verdict or "; all PASS"))
