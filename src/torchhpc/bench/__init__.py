"""Collective benchmarks with nccl-tests' semantics, GPU checks, sweeps and reports.

Importing this package loads no torch: the records, the table and the reports
are pure; :mod:`torchhpc.bench.runner`, :mod:`torchhpc.bench.context` and
:mod:`torchhpc.bench.gpu` import torch inside their functions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torchhpc.bench.collectives import COLLECTIVES, Collective, Layout, bandwidth, get_collective

if TYPE_CHECKING:
    from torchhpc.bench.config import BenchConfig
    from torchhpc.bench.report import BenchResult, CollectiveResult, Measure, Row, load_results

_REPORT = ("BenchResult", "CollectiveResult", "Measure", "Row", "load_results")

__all__ = [
    "COLLECTIVES",
    "BenchConfig",
    "BenchResult",
    "Collective",
    "CollectiveResult",
    "Layout",
    "Measure",
    "Row",
    "bandwidth",
    "get_collective",
    "load_results",
]


def __getattr__(name: str) -> Any:
    """The config and the reports load on first use: ``torchhpc --help`` registers ``bench``, whose flags
    need only the collectives."""
    if name == "BenchConfig":
        from torchhpc.bench.config import BenchConfig

        return BenchConfig
    if name in _REPORT:
        from torchhpc.bench import report

        return getattr(report, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
