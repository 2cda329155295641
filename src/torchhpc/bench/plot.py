"""busbw against message size as a PNG (matplotlib, imported only here, only when asked)."""

from __future__ import annotations

import os
from collections.abc import Sequence

from torchhpc.bench.report import BenchResult
from torchhpc.core.plot import pyplot
from torchhpc.core.units import counted, format_bytes
from torchhpc.errors import UsageError

__all__ = ["plot_results"]


def plot_results(results: Sequence[BenchResult], path: str | os.PathLike[str], title: str = "") -> str:
    """One line per (run, collective): busbw (GB/s) vs size (bytes, log2 x axis).

    With one run the lines are its collectives; with several (a sweep) each
    line is labelled by its node and rank count.
    """
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    ticks: set[int] = set()
    many = len(results) > 1
    for r in results:
        for c in r.results:
            pts = [(row.size, m.busbw) for row in c.rows if (m := row.best()) is not None]
            if not pts:
                continue
            xs, ys = zip(*pts)
            ticks.update(xs)
            label = f"{counted(r.nodes, 'node')}, {counted(r.world_size, 'rank')}" if many else c.collective
            if many and len(r.results) > 1:
                label = f"{c.collective}, {label}"
            ax.plot(xs, ys, marker="o", markersize=3, label=label)
    if not ticks:
        plt.close(fig)
        raise UsageError("nothing to plot: the results have no rows", "run with sizes of at least a few elements")
    ax.set_xscale("log", base=2)
    shown = sorted(ticks)
    step = max(1, len(shown) // 10)
    ax.set_xticks(shown[::step])
    ax.set_xticklabels([format_bytes(s) for s in shown[::step]], rotation=45, ha="right")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth busbw (GB/s, 1 GB = 1e9 B)")
    first = results[0]
    backend = ", ".join(sorted({r.backend for r in results}))
    ax.set_title(title or f"torchhpc bench: {', '.join(c.collective for c in first.results)} ({backend})")
    ax.grid(True, which="both", alpha=0.3)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.fspath(path))
    plt.close(fig)
    return os.fspath(path)
