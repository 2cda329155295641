"""``torchhpc events --plot FILE.png``: each node's attempts on a time axis, the faults marked.

matplotlib is an optional extra (``torchhpc[plot]``), imported only here and only when asked, as
``bench --plot`` does. :func:`plot_data` is the drawing as data (what the test checks);
:func:`plot_timeline` draws it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from torchhpc.diagnose.account import _num
from torchhpc.diagnose.events import Timeline

__all__ = ["Bar", "Mark", "plot_data", "plot_timeline"]


@dataclass(frozen=True)
class Bar:
    node: str
    attempt: int
    start: float  # seconds since submit
    end: float
    klass: str  # "" for a success


@dataclass(frozen=True)
class Mark:
    node: str
    attempt: int
    time: float  # seconds since submit
    klass: str


def plot_data(tl: Timeline) -> tuple[list[Bar], list[Mark]]:
    """One bar per (node, attempt) from its launch to its end; one mark per fault, on the nodes it
    excluded (the culprits) or, where none was excluded, on every node of the attempt."""
    t0 = tl.events[0].time if tl.events else 0.0
    end = t0 + tl.account.wall_s
    bars: list[Bar] = []
    marks: list[Mark] = []
    for a in tl.runs or tl.attempts:  # a job without attempts.json is drawn as the one attempt it was
        n = int(a.get("attempt") or 0)
        nodes = [str(x) for x in a.get("nodes") or ()] or ["?"]
        start = _num(a, "launched") or _num(a, "started") or t0
        stop = _num(a, "ended") or end
        klass = str(a.get("class") or "")
        bars.extend(Bar(node, n, start - t0, stop - t0, klass) for node in nodes)
        fault = _num(a, "fault") or (_num(a, "ended") if klass else None)
        if klass and fault is not None:
            culprits = [str(x) for x in a.get("excluded") or ()] or nodes
            marks.extend(Mark(node, n, fault - t0, klass) for node in culprits)
    return bars, marks


def plot_timeline(tl: Timeline, path: str | os.PathLike[str]) -> str:
    """Draw :func:`plot_data` into ``path`` (PNG); the path written."""
    from torchhpc.core.plot import pyplot

    fig = draw(tl)
    fig.savefig(os.fspath(path))
    pyplot().close(fig)
    return os.fspath(path)


def draw(tl: Timeline) -> Any:
    """The timeline as a matplotlib Figure: one row per node, the legend in a band of its own below the
    x-axis label (placed inside the axes' margin it was drawn over the label)."""
    from torchhpc.core.plot import pyplot

    plt = pyplot()
    bars, marks = plot_data(tl)
    nodes = sorted({b.node for b in bars} | {m.node for m in marks})
    row = {n: i for i, n in enumerate(nodes)}
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.5 * max(1, len(nodes))), dpi=110)
    for b in bars:
        color = "tab:green" if not b.klass else "tab:orange"
        ax.barh(row[b.node], b.end - b.start, left=b.start, height=0.6, color=color, edgecolor="black")
        ax.text(b.start + (b.end - b.start) / 2, row[b.node], f"#{b.attempt}", ha="center", va="center", fontsize=8)
    for m in marks:
        ax.plot([m.time], [row[m.node]], marker="X", color="tab:red", markersize=12, linestyle="none")
        ax.annotate(m.klass, (m.time, row[m.node] + 0.35), fontsize=8, color="tab:red")
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    band = 0.3  # inches at the bottom for the legend's one row
    fig.legend(handles=[Patch(facecolor="tab:green", edgecolor="black", label="attempt that succeeded (or runs)"),
                        Patch(facecolor="tab:orange", edgecolor="black", label="attempt ended by a fault"),
                        Line2D([], [], marker="X", color="tab:red", linestyle="none", markersize=10, label="fault")],
               loc="lower center", bbox_to_anchor=(0.5, 0.0), ncol=3, fontsize=8, frameon=False)
    ax.set_yticks(range(len(nodes)), nodes)
    ax.set_xlabel("seconds since submit")
    ax.set_title(f"{tl.job}: {tl.account.line()}", fontsize=9)
    ax.set_xlim(0, max(tl.account.wall_s, 1.0))
    fig.set_figheight(fig.get_figheight() + band)
    fig.tight_layout(rect=(0.0, band / fig.get_figheight(), 1.0, 1.0))
    return fig
