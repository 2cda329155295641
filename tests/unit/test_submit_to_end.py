"""benchmarks/submit_to_end.py's summary: the per-round paired differences beside the ratio of medians.

The benchmark itself needs the dev cluster; its arithmetic does not. A round's load moves both jobs
of a pair alike, so the paired median must see through a noise that moves the medians apart.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from types import ModuleType

import pytest

from tests.conftest import REPO

SCRIPT = REPO / "benchmarks" / "submit_to_end.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("submit_to_end", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rows(totals: list[float], runnings: list[float]) -> list[dict[str, float]]:
    return [{"total": t, "submit": 0.1, "queue": 0.5, "running": r} for t, r in zip(totals, runnings)]


def test_paired_differences_are_round_by_round(bench: ModuleType) -> None:
    # Each round's load adds the same to both jobs: torchhpc is 0.3 s slower in every round, while
    # the rounds themselves move by 20 s.
    load = [0.0, 20.0, 5.0, 12.0, 1.0]
    res = {
        "torchhpc": rows([40.3 + x for x in load], [38.3 + x for x in load]),
        "sbatch": rows([40.0 + x for x in load], [38.0 + x for x in load]),
    }
    got = bench.paired(res)
    assert set(got) == {"torchhpc"}
    for key in ("total", "running"):
        d = got["torchhpc"][key]
        assert d["diffs"] == pytest.approx([0.3] * 5)
        assert d["median"] == pytest.approx(0.3)
        assert d["min"] == pytest.approx(0.3) and d["max"] == pytest.approx(0.3)
        assert d["q1"] == pytest.approx(0.3) and d["q3"] == pytest.approx(0.3)


def test_paired_spread_and_a_short_variant(bench: ModuleType) -> None:
    res = {
        "sbatch": rows([10, 10, 10, 10], [8, 8, 8, 8]),
        "submitit": rows([11, 13, 9], [9, 9, 9]),  # one round fewer (a failed round): pairs stop at the shorter
    }
    d = bench.paired(res)["submitit"]["total"]
    assert d["diffs"] == [1, 3, -1]
    assert (d["median"], d["min"], d["max"]) == (1, -1, 3)
    assert d["q1"] <= d["median"] <= d["q3"]
    assert bench.paired_cell(d).startswith("+1.00 s [-1.00..+3.00]")


def test_fifteen_rounds_is_the_default_and_the_documented_run(bench: ModuleType) -> None:
    out = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, check=True).stdout
    assert "default 15" in out
    assert "--rounds 15" in (bench.__doc__ or "")
