"""Collective benchmarks with nccl-tests' semantics, GPU checks, sweeps and reports.

Importing this package loads no torch: the records, the table and the reports
are pure; :mod:`torchhpc.bench.runner`, :mod:`torchhpc.bench.context` and
:mod:`torchhpc.bench.gpu` import torch inside their functions.
"""

from __future__ import annotations

from torchhpc.bench.collectives import COLLECTIVES, Collective, Layout, bandwidth, get_collective
from torchhpc.bench.config import BenchConfig
from torchhpc.bench.report import BenchResult, CollectiveResult, Measure, Row, load_results

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
