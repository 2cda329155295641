"""Sweeps over node counts, and the report they (or saved JSON) produce.

A sweep is thin on purpose: one ordinary :class:`JobSpec` per node count whose
entrypoint is ``python -m torchhpc.bench run -t COLL ... --json OUT/bench-<N>n.json``,
submitted through the normal scheduler path (so containers, profiles and
network presets apply exactly as for training jobs), run one after another
(concurrent jobs would share the network they measure), then
:func:`write_report` over the folder. The folder must be visible from the
compute nodes (a shared file system), as job logs already are.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from torchhpc.bench.report import load_results, sweep_markdown
from torchhpc.core.handle import Handle
from torchhpc.core.spec import Entrypoint, JobSpec
from torchhpc.core.units import counted
from torchhpc.errors import TorchHPCError, UsageError

__all__ = ["SweepJob", "parse_nodes", "plan", "run_sweep", "write_report"]

REPORT_MD = "report.md"
REPORT_PNG = "busbw.png"


def parse_nodes(text: str, source: str = "--nodes") -> list[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]`` (also ``1-4`` ranges), each at least 1, order kept, no repeats."""
    out: list[int] = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                vals = list(range(lo, hi + 1))
            else:
                vals = [int(part)]
        except ValueError:
            raise UsageError(f"{source} {text!r}: {part!r} is not a node count", "e.g. --nodes 1,2,4 or 1-3") from None
        for v in vals:
            if v < 1:
                raise UsageError(f"{source} {text!r}: node count {v} must be at least 1")
            if v not in out:
                out.append(v)
    if not out:
        raise UsageError(f"{source} {text!r} names no node count", "e.g. --nodes 1,2,4")
    return out


@dataclass(frozen=True)
class SweepJob:
    nodes: int
    spec: JobSpec
    json_path: str


def plan(base: JobSpec, nodes: Sequence[int], collective: str, bench_args: Sequence[str], out: str) -> list[SweepJob]:
    """One job per node count, identical but for ``nodes``, its name and its JSON path."""
    for flag in ("--json", "--plot"):
        if any(a == flag or a.startswith(flag + "=") for a in bench_args):
            raise UsageError(f"bench sweep sets {flag} itself (one file per node count in --out)",
                             f"drop {flag} from the flags after --")
    out_dir = os.path.abspath(out)
    jobs = []
    for n in nodes:
        path = os.path.join(out_dir, f"bench-{n}n.json")
        entry = Entrypoint("module", "torchhpc.bench", ("run", "-t", collective, *bench_args, "--json", path),
                           base.entrypoint.python)
        spec = replace(base, entrypoint=entry, nodes=n, name=f"{base.name}-{n}n", output_dir=out_dir)
        jobs.append(SweepJob(n, spec, path))
    return jobs


def run_sweep(
    jobs: Sequence[SweepJob],
    scheduler: object,
    *,
    timeout: float | None = None,
    progress: Callable[[str], None] | None = None,
    poll: float = 1.0,
) -> list[str]:
    """Submit and wait for each job in turn; returns what failed (empty when all passed)."""
    from torchhpc.schedulers.api import JobStatus, Scheduler

    assert isinstance(scheduler, Scheduler)
    say = progress or (lambda _t: None)
    # An earlier sweep's results are never deleted or overwritten (and a stale one cannot pass for a new one).
    taken = [j.json_path for j in jobs if os.path.lexists(j.json_path)]
    if jobs and os.path.lexists(os.path.join(jobs[0].spec.output_dir, REPORT_MD)):
        taken.append(os.path.join(jobs[0].spec.output_dir, REPORT_MD))
    if taken:
        raise UsageError(
            f"--out {jobs[0].spec.output_dir} already holds {', '.join(os.path.basename(t) for t in taken)} "
            "(an earlier sweep): torchhpc does not overwrite results",
            "give a new --out DIR, or move the old one away",
        )
    failed: list[str] = []
    for i, job in enumerate(jobs, 1):
        Path(job.spec.output_dir).mkdir(parents=True, exist_ok=True)
        job_id = scheduler.submit(job.spec)
        tag = f"[{i}/{len(jobs)}] {counted(job.nodes, 'node')} {Handle(scheduler.name, job_id)}"

        def show(st: JobStatus, waited: float, tag: str = tag) -> None:
            say(f"{tag} {st.state} {st.elapsed_or_waited(waited)}")

        try:
            st = scheduler.wait(job_id, poll=poll, timeout=timeout, progress=show)
        except TorchHPCError as e:
            failed.append(f"{counted(job.nodes, 'node')}: {e.message}")
            continue
        if not st.ok:
            failed.append(f"{counted(job.nodes, 'node')}: job {job_id} {st.line()}")
        elif not os.path.exists(job.json_path):
            failed.append(f"{counted(job.nodes, 'node')}: job {job_id} completed but wrote no {job.json_path}")
    return failed


def write_report(
    paths: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str] | None = None, collective: str | None = None
) -> tuple[str, str | None]:
    """Markdown table + PNG from every bench JSON under ``paths``; returns their paths.

    Without matplotlib the Markdown is still written (without the image link) and
    the PNG is skipped with a one-line note on stderr: its path comes back as None.
    """
    from torchhpc.bench import plot
    from torchhpc.core.plot import check_available

    results = load_results(paths)
    if out is None:
        first = Path(paths[0])
        out = first if first.is_dir() else first.parent
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    md_path = out_dir / REPORT_MD
    png_path = out_dir / REPORT_PNG
    try:
        check_available()
        can_plot = True
    except UsageError:
        can_plot = False
    text = sweep_markdown(results, collective)
    if can_plot:
        text += f"\n![busbw by size]({REPORT_PNG})\n"
    md_path.write_text(text)
    if not can_plot:
        print(f"Note: {REPORT_PNG} not written: matplotlib is not installed "
              "(pip install 'torchhpc[plot]', then run `torchhpc bench report` again)", file=sys.stderr)
        return str(md_path), None

    chosen = results
    if collective:
        chosen = [replace(r, results=[c for c in r.results if c.collective == collective]) for r in results]
    names = sorted({c.collective for r in chosen for c in r.results})
    backends = sorted({r.backend for r in chosen})
    plot.plot_results(chosen, png_path, title=f"busbw by size: {', '.join(names)} ({', '.join(backends)})")
    return str(md_path), str(png_path)
