"""``torchhpc top``'s data: one row per rank of a running job, and the straggler among them.

A row joins what the node-side probe (:mod:`torchhpc.observe.sample`) saw of the rank's
process with what its log shows: seconds since its last line, and its progress
(:mod:`torchhpc.observe.progress`).

**Straggler.** In synchronous training every rank advances at the same step rate, so the rate
cannot show the slow one. What differs is where the ranks spend their time: the fast ones finish
their step first and wait for the slow one inside the collective, and the slow one arrives last
and hardly waits. So the rank that straggles is the one that spends the *least* time inside
collectives. The rule (:func:`stragglers`): among the ranks with at least :data:`MIN_SAMPLES`
stack samples, a rank is a straggler when its collective share is below half the median share of
the other ranks and at least :data:`MIN_GAP` percentage points below it. With that median under
``MIN_GAP`` (the ranks barely communicate, or all compute) nobody is flagged: there is no wait to
compare.
"""

from __future__ import annotations

import os
import re
import statistics
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, Optional

from torchhpc.diagnose.probe import ask_nodes, one_per_process
from torchhpc.observe.progress import parse_progress, read_tail
from torchhpc.observe.sample import DURATION_S, RATE_HZ, RankSample, sample

if TYPE_CHECKING:
    from torchhpc.schedulers.allocation import Allocation

__all__ = ["FOLD_AT", "MIN_GAP", "MIN_SAMPLES", "RankRow", "gather", "probe_nodes", "sample_argv", "stragglers"]

MIN_SAMPLES = 10  # fewer stack samples than this say nothing about a rank's share
MIN_GAP = 20.0  # percentage points below the median a straggler must be, at least
FOLD_AT = 32  # more ranks than this: the table shows one row per node


@dataclass(frozen=True)
class RankRow:
    """What ``top --json`` prints per rank."""

    rank: int
    host: str
    state: str
    pid: Optional[int] = None
    cpu_pct: Optional[float] = None
    rss_mb: Optional[float] = None
    gpu_util: Optional[float] = None
    gpu_mem_mb: Optional[float] = None
    quiet_s: Optional[float] = None
    progress: Optional[dict[str, Any]] = None
    samples: int = 0
    collective_pct: Optional[float] = None  # share of stack samples inside a collective
    collectives: dict[str, int] = field(default_factory=dict)
    straggler: bool = False
    error: str = ""
    gpu_health: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def stragglers(shares: dict[int, float], samples: dict[int, int]) -> set[int]:
    """The ranks whose collective share is far below the others' median (the rule in the module's docstring).

    Each rank is held against the median of the *other* ranks: with its own share in the median, a
    straggler pulls the mark down towards itself, and among two ranks (``top --node`` on one node)
    it would have to wait less than a third as long as its peer to be seen at all."""
    known = {r: s for r, s in shares.items() if samples.get(r, 0) >= MIN_SAMPLES}
    if len(known) < 2:
        return set()
    out = set()
    for r, s in known.items():
        median = statistics.median(v for q, v in known.items() if q != r)
        if median >= MIN_GAP and s < median / 2 and median - s >= MIN_GAP:
            out.add(r)
    return out


def sample_argv(alloc: Allocation, nodes: Sequence[str], duration: int = DURATION_S, rate: int = RATE_HZ) -> list[str]:
    """One look at each of ``nodes``: the sampler once per node, inside the job's allocation."""
    match = [f"{k}={v}" for k, v in alloc.rank_match().items()]
    module = [sys.executable, "-m", "torchhpc.observe.sample", "--duration", str(duration), "--rate", str(rate)]
    return alloc.on_nodes([*module, *match], nodes)


def probe_nodes(alloc: Allocation, nodes: Sequence[str], duration: int = DURATION_S, rate: int = RATE_HZ) -> list[RankSample]:
    """The sample of each of ``nodes``: in this process (local), or once per node through the allocation."""
    if alloc.here:
        return sample(alloc.rank_match(), "localhost", duration, rate)
    found, _said = ask_nodes(alloc.runner, sample_argv(alloc, nodes, duration, rate), 60 + duration)
    return one_per_process(found, RankSample)


def _quiet_and_progress(log: Any) -> tuple[dict[int, tuple[float, str]], dict[int, str]]:
    """rank -> (last write, node), and rank -> the tail of its output, from the job's log files."""
    from torchhpc.jobdir.logs import last_writes, rank_files

    if log is None:
        return {}, {}
    if log.ranks_dir and os.path.isdir(log.ranks_dir):
        files = rank_files(log.ranks_dir)
        if files:
            return last_writes(log.ranks_dir), {r: read_tail(p) for r, (p, _n) in files.items()}
    if not log.output:
        return {}, {}
    # the local scheduler's one combined log: every line "[rankN]: ...", one write time for all. A tqdm
    # redraw ends in "\r", not a newline: each "\r[rankN]: " starts that rank's own segment.
    text = read_tail(log.output, 512 * 1024)
    tails: dict[int, list[str]] = {}
    for line in re.split(r"\n|\r(?=\[rank\d+\]: )", text):
        if line.startswith("[rank"):
            head, _, rest = line.partition("]: ")
            if head[5:].isdigit():
                tails.setdefault(int(head[5:]), []).append(rest)
    try:
        mtime = os.stat(log.output).st_mtime
    except OSError:
        return {}, {r: "\n".join(t) for r, t in tails.items()}
    return {r: (mtime, "") for r in tails}, {r: "\n".join(t) for r, t in tails.items()}


def gather(samples: Iterable[RankSample], log: Any, world: Optional[int] = None,
           now: Optional[float] = None) -> list[RankRow]:
    """One row per rank: the probe's samples joined with the log's quiet time and progress; a rank
    the log knows but no node showed is ``gone``; stragglers flagged over all ranks."""
    now = time.time() if now is None else now
    writes, tails = _quiet_and_progress(log)
    rows: dict[int, RankRow] = {}
    for s in samples:
        pct = round(100.0 * s.in_collective / s.samples, 1) if s.samples else None
        rows[s.rank] = RankRow(s.rank, s.host, s.state, s.pid, s.cpu_pct, s.rss_mb, s.gpu_util, s.gpu_mem_mb,
                               samples=s.samples, collective_pct=pct, collectives=dict(s.calls), error=s.error,
                               gpu_health=s.gpu_health)
    for r in set(writes) | set(range(world or 0)):
        if r not in rows:
            rows[r] = RankRow(r, writes.get(r, (0.0, ""))[1], "gone")
    flagged = stragglers({r: x.collective_pct for r, x in rows.items() if x.collective_pct is not None},
                         {r: x.samples for r, x in rows.items()})
    out = []
    for r in sorted(rows):
        quiet = round(max(0.0, now - writes[r][0]), 1) if r in writes else None
        out.append(replace(rows[r], quiet_s=quiet, progress=parse_progress(tails.get(r, "")), straggler=r in flagged))
    return out


def _fmt(v: Optional[float], spec: str = ".0f") -> str:
    return "-" if v is None else format(v, spec)


def progress_text(p: Optional[dict[str, Any]]) -> str:
    """A progress object in a few words: ``45/100 10.1it/s loss=0.123``."""
    if not p:
        return "-"
    bits = []
    if "n" in p:
        n = f"{p['n']:g}"
        bits.append(f"{n}/{p['total']:g}" if p.get("total") else n)
    if p.get("rate") is not None:
        bits.append(f"{p['rate']:.3g}{p.get('unit', '')}")
    bits += [f"{k}={p['metrics'][k]:.4g}" for k in ("loss", "epoch") if k in p.get("metrics", {})]
    return " ".join(bits) or p.get("kind", "-")


def table(rows: Sequence[RankRow]) -> list[str]:
    """The table ``top`` prints: per rank, or (more than :data:`FOLD_AT` ranks) per node."""
    from torchhpc.jobdir.logs import format_ranks

    if len(rows) <= FOLD_AT:
        gpu = any(r.gpu_health for r in rows)  # the health column only where an NVIDIA GPU answered
        lines = [f"{'RANK':>4} {'HOST':<10} {'STATE':<9} {'CPU%':>5} {'RSS_MB':>7} {'GPU%':>4} {'GPU_MB':>6} "
                 + (f"{'GPU_HEALTH':<12} " if gpu else "") + f"{'QUIET':>5} {'COLL%':>5}  PROGRESS"]
        for r in rows:
            coll = _fmt(r.collective_pct) + ("*" if r.straggler else "")
            lines.append(f"{r.rank:>4} {r.host[:10]:<10} {r.state[:9]:<9} {_fmt(r.cpu_pct):>5} {_fmt(r.rss_mb):>7} "
                         f"{_fmt(r.gpu_util):>4} {_fmt(r.gpu_mem_mb):>6} " + (f"{r.gpu_health or '-':<12} " if gpu else "")
                         + f"{_fmt(r.quiet_s):>5} {coll:>5}  {progress_text(r.progress)}")
    else:
        lines = [f"{'HOST':<10} {'RANKS':<10} {'STATES':<14} {'CPU%':>5} {'RSS_MB':>7} {'QUIET':>5} "
                 f"{'COLL%':>9}  STRAGGLERS"]
        by_host: dict[str, list[RankRow]] = {}
        for r in rows:
            by_host.setdefault(r.host or "?", []).append(r)
        for host, rs in sorted(by_host.items()):
            states = ",".join(sorted({r.state for r in rs}))
            cpu = [r.cpu_pct for r in rs if r.cpu_pct is not None]
            rss = [r.rss_mb for r in rs if r.rss_mb is not None]
            quiet = [r.quiet_s for r in rs if r.quiet_s is not None]
            shares = [r.collective_pct for r in rs if r.collective_pct is not None]
            span = f"{min(shares):.0f}-{max(shares):.0f}" if shares else "-"
            slow = format_ranks(r.rank for r in rs if r.straggler) or "-"
            lines.append(f"{host[:10]:<10} {format_ranks(r.rank for r in rs)[:10]:<10} {states[:14]:<14} "
                         f"{_fmt(statistics.mean(cpu) if cpu else None):>5} {_fmt(sum(rss) if rss else None):>7} "
                         f"{_fmt(max(quiet) if quiet else None):>5} {span:>9}  {slow}")
    flagged = [r for r in rows if r.straggler]
    if flagged:
        lines.append(f"straggler: rank {format_ranks(r.rank for r in flagged)} (in collectives far less than the other ranks: "
                     "they wait for it)")
    errors = sorted({r.error for r in rows if r.error})
    lines.extend(f"note: {e}" for e in errors[:3])
    return lines
