"""The benchmark for real: 2 gloo ranks on loopback, started by ``torchhpc run -n 2`` (the local scheduler).

Nothing is faked: real processes, real collectives, real correctness checks.
The corrupted-results case uses the runner's test-only hook
(``TORCHHPC_BENCH_CORRUPT_RANK``), which damages one element of one rank's
result after the check call, exactly as a broken collective would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import need
from torchhpc.bench.collectives import COLLECTIVES

need("torch")
pytestmark = pytest.mark.slow


def bench(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHHPC_")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "torchhpc", "run", "-n", "2", "-m", "torchhpc.bench", *args],
        cwd=tmp_path, env=full_env, capture_output=True, text=True, timeout=300,
    )


def test_every_collective_two_ranks_json_and_plot(tmp_path: Path) -> None:
    need("matplotlib")
    r = bench(tmp_path, "run", "-t", ",".join(COLLECTIVES), "-b", "1K", "-e", "256K", "-f", "16",
              "-n", "3", "-w", "1", "--json", "out/all.json", "--plot", "out/all.png")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert out.count("# Out of bounds values : 0 OK") == len(COLLECTIVES)
    assert "world size 2" in out and out.count("device cpu") == 2
    data = json.loads((tmp_path / "out" / "all.json").read_text())
    assert data["world_size"] == 2 and data["wrong"] == 0 and data["backend"] == "gloo"
    assert [c["collective"] for c in data["results"]] == list(COLLECTIVES)
    for c in data["results"]:
        coll = COLLECTIVES[c["collective"]]
        assert [row["size"] for row in c["rows"]] == [1024, 16384, 262144], c["collective"]
        for row in c["rows"]:
            for place, present in (("out_of_place", coll.out_of_place), ("in_place", coll.in_place)):
                m = row[place]
                assert (m is not None) == present
                if m:
                    assert m["wrong"] == 0 and m["time_us"] > 0 and m["median_us"] > 0
                    # busbw = algbw x the collective's factor for 2 ranks
                    assert m["busbw"] == pytest.approx(m["algbw"] * coll.factor(2))
                    assert m["algbw"] == pytest.approx(row["size"] / m["time_us"] / 1e3)
    png = (tmp_path / "out" / "all.png").read_bytes()
    assert png[:4] == b"\x89PNG"


def test_corrupted_result_counts_wrong_and_fails(tmp_path: Path) -> None:
    r = bench(tmp_path, "all_reduce", "-b", "1K", "-e", "4K", "-f", "4", "-n", "2", "-w", "1",
              "--json", "bad.json", env={"TORCHHPC_BENCH_CORRUPT_RANK": "1"})
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "# Out of bounds values : 4 FAILED" in out  # one element, two sizes, both placements
    assert "wrong value" in out
    data = json.loads((tmp_path / "bad.json").read_text())
    assert data["wrong"] == 4
    for place in ("out_of_place", "in_place"):
        assert [row[place]["wrong"] for row in data["results"][0]["rows"]] == [1, 1]


def test_min_bw_fails_the_run(tmp_path: Path) -> None:
    r = bench(tmp_path, "all_reduce", "-b", "64K", "-e", "64K", "-n", "2", "-w", "1", "--min-bw", "1000")
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "# Out of bounds values : 0 OK" in out
    assert "below --min-bw 1000" in out and "# Minimum bus bandwidth: 1000 GB/s FAILED" in out


def test_single_process_module_form(tmp_path: Path) -> None:
    """``python -m torchhpc.bench`` alone: one rank, busbw 0 by definition, said in the footer."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHHPC_", "RANK", "WORLD_SIZE", "MASTER_"))}
    r = subprocess.run([sys.executable, "-m", "torchhpc.bench", "broadcast", "-t", "all_reduce", "-b", "4K", "-e", "4K",
                        "-n", "2"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "world size 1" in r.stdout and "busbw is 0 by definition" in r.stdout
