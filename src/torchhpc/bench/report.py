"""Results as data, and their three faces: the nccl-tests table, JSON, the sweep's Markdown.

Pure (no torch): the runner fills these records on rank 0, ``bench report``
rebuilds everything from saved JSON on a login node.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from torchhpc.core.units import counted, format_bytes
from torchhpc.errors import UsageError

__all__ = [
    "SCHEMA",
    "BenchResult",
    "CollectiveResult",
    "Measure",
    "RankInfo",
    "Row",
    "footer_lines",
    "header_lines",
    "load_results",
    "row_line",
    "sweep_markdown",
    "table_header",
]

SCHEMA = "torchhpc.bench/1"


@dataclass
class Measure:
    """One placement (out-of-place or in-place) of one size."""

    time_us: float  # mean time per call (back-to-back calls), combined over ranks per -a
    median_us: float  # median of the per-call times, combined the same way
    algbw: float  # GB/s, 1 GB = 1e9 bytes
    busbw: float
    wrong: Optional[int]  # None when not checked (-c 0)


@dataclass
class Row:
    size: int
    count: int
    type: str
    redop: str
    root: int
    out_of_place: Optional[Measure]
    in_place: Optional[Measure]

    def measures(self) -> list[Measure]:
        return [m for m in (self.out_of_place, self.in_place) if m is not None]

    def best(self) -> Optional[Measure]:
        """The placement a summary shows: out-of-place (nccl-tests' habit) where torch has it."""
        return self.out_of_place or self.in_place


@dataclass
class CollectiveResult:
    collective: str
    rows: list[Row] = field(default_factory=list)

    @property
    def wrong(self) -> int:
        return sum(m.wrong or 0 for r in self.rows for m in r.measures())

    @property
    def avg_busbw(self) -> float:
        """nccl-tests' ``Avg bus bandwidth``: the mean busbw over every size and placement."""
        values = [m.busbw for r in self.rows for m in r.measures()]
        return sum(values) / len(values) if values else 0.0

    def largest(self) -> Optional[Row]:
        return max(self.rows, key=lambda r: r.size) if self.rows else None


@dataclass
class RankInfo:
    rank: int
    host: str
    pid: int
    device: str


@dataclass
class BenchResult:
    config: dict[str, Any]
    world_size: int
    backend: str
    ranks: list[RankInfo]
    results: list[CollectiveResult]
    torch_version: str = ""
    started: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    label: str = ""

    @property
    def nodes(self) -> int:
        return len({r.host for r in self.ranks}) or 1

    @property
    def wrong(self) -> int:
        return sum(r.wrong for r in self.results)

    @property
    def avg_busbw(self) -> float:
        values = [m.busbw for c in self.results for r in c.rows for m in r.measures()]
        return sum(values) / len(values) if values else 0.0

    def failures(self, min_bw: float | None = None) -> list[str]:
        """Why this run fails (empty when it passes): wrong values, or busbw under ``--min-bw``."""
        out = []
        if self.wrong:
            out.append(f"{counted(self.wrong, 'wrong value')} in the correctness check (#wrong column)")
        if min_bw is not None and self.avg_busbw < min_bw:
            out.append(f"average bus bandwidth {self.avg_busbw:.3f} GB/s is below --min-bw {min_bw:g} GB/s")
        return out

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["schema"] = SCHEMA
        d["nodes"] = self.nodes
        d["wrong"] = self.wrong
        d["avg_busbw"] = self.avg_busbw
        for c, cd in zip(self.results, d["results"]):
            cd["wrong"] = c.wrong
            cd["avg_busbw"] = c.avg_busbw
        return d

    def save(self, path: str | os.PathLike[str]) -> None:
        p = Path(path)
        if p.parent and not p.parent.exists():
            p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        tmp.replace(p)  # a sweep never reads half a file

    @classmethod
    def from_json(cls, d: dict[str, Any], source: str = "JSON") -> BenchResult:
        if d.get("schema") != SCHEMA:
            raise UsageError(
                f"{source} is not a torchhpc bench result (schema {d.get('schema')!r}, expected {SCHEMA!r})",
                "give files written by `torchhpc bench ... --json FILE`",
            )

        def measure(m: dict[str, Any] | None) -> Optional[Measure]:
            return Measure(**m) if m else None

        results = [
            CollectiveResult(
                c["collective"],
                [
                    Row(r["size"], r["count"], r["type"], r["redop"], r["root"],
                        measure(r["out_of_place"]), measure(r["in_place"]))
                    for r in c["rows"]
                ],
            )
            for c in d["results"]
        ]
        return cls(
            config=d["config"],
            world_size=int(d["world_size"]),
            backend=d.get("backend", ""),
            ranks=[RankInfo(**r) for r in d.get("ranks", [])],
            results=results,
            torch_version=d.get("torch_version", ""),
            started=d.get("started", ""),
            label=d.get("label", ""),
        )


# --- the nccl-tests table ---------------------------------------------------

_HALF = "  {:>8}  {:>7}  {:>7}  {:>6}"


def header_lines(config: dict[str, Any], world_size: int, backend: str, ranks: Sequence[RankInfo]) -> list[str]:
    """``#`` lines before the table: the configuration and one line per rank (host, device)."""
    avg = {0: "rank 0", 1: "average", 2: "minimum", 3: "maximum"}.get(int(config.get("average", 1)), "?")
    step = (
        f"{config['stepfactor']:g}(factor)" if config["stepfactor"] > 1 else f"{format_bytes(config['stepbytes'])}(bytes)"
    )
    return [
        f"# torchhpc bench: {', '.join(config['collectives'])}  backend {backend}  world size {world_size}"
        f"  nodes {len({r.host for r in ranks}) or 1}",
        f"# minBytes {config['minbytes']} maxBytes {config['maxbytes']} step: {step} warmup iters: "
        f"{config['warmup']} iters: {config['iters']} validation: {config['check']} datatype: {config['datatype']}"
        f" op: {config['op']} root: {config['root']} time: {avg} over ranks",
        "#",
        "# Using devices",
        *(f"#  Rank {r.rank:3d} Pid {r.pid:7d} on {r.host:>12} device {r.device}" for r in ranks),
        "#",
    ]


def table_header(collective: str) -> list[str]:
    head = "#{:>11}  {:>12}  {:>8}  {:>6}  {:>6}".format("size", "count", "type", "redop", "root")
    units = "#{:>11}  {:>12}  {:>8}  {:>6}  {:>6}".format("(B)", "(elements)", "", "", "")
    oop_ip = "#" + " " * 51 + "{:^36}{:^36}".format("out-of-place", "in-place")
    return [
        f"# Collective: {collective}",
        oop_ip,
        head + _HALF.format("time", "algbw", "busbw", "#wrong") * 2 + "  {:>8}  {:>8}".format("median", "median"),
        units + _HALF.format("(us)", "(GB/s)", "(GB/s)", "") * 2 + "  {:>8}  {:>8}".format("oop(us)", "ip(us)"),
    ]


def _fmt_time(us: float) -> str:
    return f"{us:8.2f}" if us < 1e5 else f"{us:8.0f}"


def _half(m: Optional[Measure]) -> str:
    if m is None:
        return _HALF.format("n/a", "n/a", "n/a", "n/a")
    wrong = "N/A" if m.wrong is None else str(m.wrong)
    return _HALF.format(_fmt_time(m.time_us), f"{m.algbw:7.2f}", f"{m.busbw:7.2f}", wrong)


def row_line(row: Row) -> str:
    med = [_fmt_time(m.median_us) if m else "n/a" for m in (row.out_of_place, row.in_place)]
    root = str(row.root)
    return (
        f"{row.size:>12}  {row.count:>12}  {row.type:>8}  {row.redop:>6}  {root:>6}"
        + _half(row.out_of_place)
        + _half(row.in_place)
        + f"  {med[0]:>8}  {med[1]:>8}"
    )


def footer_lines(res: CollectiveResult, world_size: int, min_bw: float | None = None) -> list[str]:
    ok = "OK" if res.wrong == 0 else "FAILED"
    lines = [
        f"# Out of bounds values : {res.wrong} {ok}",
        f"# Avg bus bandwidth    : {res.avg_busbw:.4g} GB/s",
    ]
    if world_size == 1:
        lines.append(
            "# (one rank: no data crosses a link, so busbw is 0 by definition for all_reduce, "
            "all_gather, reduce_scatter and all_to_all; see `torchhpc bench explain`)"
        )
    if min_bw is not None:
        verdict = "OK" if res.avg_busbw >= min_bw else "FAILED"
        lines.append(f"# Minimum bus bandwidth: {min_bw:g} GB/s {verdict}")
    lines.append("#")
    return lines


def render_table(result: BenchResult, min_bw: float | None = None) -> str:
    """The full text output of a run, as rank 0 prints it."""
    lines = header_lines(result.config, result.world_size, result.backend, result.ranks)
    for c in result.results:
        lines += table_header(c.collective)
        lines += [row_line(r) for r in c.rows]
        lines += footer_lines(c, result.world_size, min_bw)
    return "\n".join(lines) + "\n"


# --- reports over several runs (a sweep) -------------------------------------


def load_results(paths: Iterable[str | os.PathLike[str]]) -> list[BenchResult]:
    """Every ``*.json`` bench result under the given files or directories, sorted by world size."""
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files += sorted(p.rglob("*.json"))
        elif p.is_file():
            files.append(p)
        else:
            raise UsageError(f"{str(p)!r} is neither a file nor a directory", "give bench JSON files or their folders")
    out = []
    for f in files:
        try:
            data = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise UsageError(f"cannot read bench JSON {str(f)!r}: {e}") from None
        if isinstance(data, dict) and data.get("schema") == SCHEMA:
            r = BenchResult.from_json(data, str(f))
            r.label = r.label or f.stem
            out.append(r)
    if not out:
        raise UsageError(
            f"no torchhpc bench JSON found in {', '.join(map(str, paths))}",
            "write results with `torchhpc bench ... --json DIR/NAME.json`",
        )
    return sorted(out, key=lambda r: (r.nodes, r.world_size, r.label))


def _gbps(gb_per_s: float) -> str:
    return f"{gb_per_s * 8:.1f}"


def sweep_markdown(results: Sequence[BenchResult], collective: str | None = None) -> str:
    """The seeds' table (nodes | ranks | busbw | algbw at the largest size) plus per-size tables.

    busbw and algbw are given in GB/s and, because the seeds' tables are in
    Gbit/s, also in Gbps (x8).
    """
    names = [c.collective for c in results[0].results] if results else []
    chosen = [collective] if collective else names
    out = ["# torchhpc bench report", ""]
    out.append(f"{counted(len(results), 'run')}; bandwidths in GB/s (1 GB = 1e9 bytes) and Gbps (x8); "
               "out-of-place where torch has it, else in-place. `torchhpc bench explain` says what busbw means.")
    out.append("")
    for name in chosen:
        runs = [(r, c) for r in results for c in r.results if c.collective == name]
        if not runs:
            continue
        out += [f"## {name}", ""]
        out.append("| nodes | ranks | size | busbw (GB/s) | algbw (GB/s) | busbw (Gbps) | algbw (Gbps) "
                   "| avg busbw (GB/s) | #wrong | run |")
        out.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|:--|")
        for r, c in runs:
            row = c.largest()
            m = row.best() if row else None
            if row is None or m is None:
                continue
            out.append(
                f"| {r.nodes} | {r.world_size} | {format_bytes(row.size)} | {m.busbw:.2f} | {m.algbw:.2f} "
                f"| {_gbps(m.busbw)} | {_gbps(m.algbw)} | {c.avg_busbw:.2f} | {c.wrong} | {r.label} |"
            )
        out.append("")
        sizes = sorted({row.size for _, c in runs for row in c.rows})
        out.append(f"### {name}: busbw (GB/s) by size")
        out.append("")
        out.append("| size | " + " | ".join(f"{r.nodes}n x {r.world_size}r" for r, _ in runs) + " |")
        out.append("|---:|" + "---:|" * len(runs))
        for s in sizes:
            cells = []
            for _, c in runs:
                m = next((row.best() for row in c.rows if row.size == s), None)
                cells.append(f"{m.busbw:.3f}" if m else "")
            out.append(f"| {format_bytes(s)} | " + " | ".join(cells) + " |")
        out.append("")
        med = [row.best() for _, c in runs for row in c.rows]
        ratios = [m.median_us / m.time_us for m in med if m and m.time_us > 0]
        if ratios:
            out.append(f"Median / mean per-call time over all sizes: {statistics.median(ratios):.2f} "
                       "(well below 1 means a few slow calls pull the mean up).")
            out.append("")
    return "\n".join(out)
