"""The nccl-tests table, JSON round trip, the sweep's Markdown and the PNG (pure records, real matplotlib)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import need
from torchhpc.bench.report import (
    BenchResult,
    CollectiveResult,
    Measure,
    RankInfo,
    Row,
    load_results,
    render_table,
    sweep_markdown,
)
from torchhpc.bench.sweep import parse_nodes, write_report
from torchhpc.errors import UsageError

CONFIG = {
    "collectives": ["all_reduce"], "minbytes": 1024, "maxbytes": 4096, "stepfactor": 4.0, "stepbytes": 1 << 20,
    "iters": 20, "warmup": 5, "check": 1, "datatype": "float", "op": "sum", "root": 0, "average": 1,
    "device": "auto", "json": None, "plot": None, "min_bw": None,
}


def make_result(nodes: int = 1, per_node: int = 2, wrong: int = 0, scale: float = 1.0) -> BenchResult:
    world = nodes * per_node
    ranks = [RankInfo(r, f"node{r // per_node + 1}", 100 + r, "cpu") for r in range(world)]
    rows = [
        Row(1024, 256, "float", "sum", -1, None, Measure(100.0, 90.0, 0.01 * scale, 0.01 * scale, 0)),
        Row(4096, 1024, "float", "sum", -1, None, Measure(200.0, 150.0, 0.02 * scale, 0.03 * scale, wrong)),
    ]
    ag = [Row(4096, 512, "float", "none", -1, Measure(80.0, 80.0, 0.05, 0.025, 0), Measure(90.0, 85.0, 0.04, 0.02, 0))]
    return BenchResult(dict(CONFIG, collectives=["all_reduce", "all_gather"]), world, "gloo", ranks,
                       [CollectiveResult("all_reduce", rows), CollectiveResult("all_gather", ag)],
                       torch_version="2.x")


def test_table_has_nccl_tests_shape() -> None:
    text = render_table(make_result())
    lines = text.splitlines()
    assert all(line.startswith("#") or line.split()[0].isdigit() for line in lines)
    assert "#  Rank   1 Pid     101 on        node1 device cpu" in text
    head = next(line for line in lines if "redop" in line).split()
    assert head[1:6] == ["size", "count", "type", "redop", "root"]
    assert head[6:10] == ["time", "algbw", "busbw", "#wrong"] == head[10:14]
    row = next(line for line in lines if line.split()[0] == "4096" and "sum" in line).split()
    # a row without an out-of-place measure (JSON from before it was timed) reads n/a there
    assert row[:5] == ["4096", "1024", "float", "sum", "-1"]
    assert row[5:9] == ["n/a"] * 4 and row[9:13] == ["200.00", "0.02", "0.03", "0"]
    assert row[13:] == ["n/a", "150.00"]
    assert "# Out of bounds values : 0 OK" in text
    assert "# Avg bus bandwidth    : 0.02 GB/s" in text  # (0.01 + 0.03) / 2


def test_wrong_values_fail_and_min_bw() -> None:
    bad = make_result(wrong=3)
    assert "# Out of bounds values : 3 FAILED" in render_table(bad)
    assert bad.failures() == ["3 wrong values in the correctness check (#wrong column)"]
    good = make_result()
    assert good.failures() == [] and good.failures(min_bw=0.001) == []
    msg = good.failures(min_bw=1000)
    assert len(msg) == 1 and "below --min-bw 1000" in msg[0]
    assert "# Minimum bus bandwidth: 1000 GB/s FAILED" in render_table(good, min_bw=1000)


def test_one_rank_footer_explains_zero_busbw() -> None:
    r = make_result(per_node=1)
    assert "busbw is 0 by definition" in render_table(r)
    assert "by definition" not in render_table(make_result())


def test_json_round_trip(tmp_path: Path) -> None:
    r = make_result(nodes=2, wrong=1)
    path = tmp_path / "sub" / "r.json"
    r.save(path)
    data = json.loads(path.read_text())
    assert data["schema"] == "torchhpc.bench/1" and data["nodes"] == 2 and data["wrong"] == 1
    assert data["results"][0]["rows"][1]["in_place"]["median_us"] == 150.0
    assert data["results"][0]["rows"][0]["out_of_place"] is None
    back = BenchResult.from_json(data)
    assert render_table(back) == render_table(r)
    with pytest.raises(UsageError, match="not a torchhpc bench result"):
        BenchResult.from_json({"schema": "other"}, "x.json")


def test_load_results_sorts_and_skips_foreign_json(tmp_path: Path) -> None:
    make_result(nodes=3).save(tmp_path / "c.json")
    make_result(nodes=1).save(tmp_path / "a.json")
    (tmp_path / "other.json").write_text('{"hello": 1}')
    rs = load_results([tmp_path])
    assert [r.nodes for r in rs] == [1, 3] and [r.label for r in rs] == ["a", "c"]
    with pytest.raises(UsageError, match="no torchhpc bench JSON"):
        load_results([tmp_path / "other.json"])
    with pytest.raises(UsageError, match="neither a file nor a directory"):
        load_results([tmp_path / "missing"])
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(UsageError, match=r"broken\.json"):
        load_results([tmp_path])


def test_sweep_markdown_is_the_seeds_table() -> None:
    md = sweep_markdown([make_result(1), make_result(2, scale=2.0)], "all_reduce")
    lines = md.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("| nodes |"))
    assert lines[head].split("|")[1:5] == [" nodes ", " ranks ", " size ", " busbw (GB/s) "]
    one = lines[head + 2].split("|")
    two = lines[head + 3].split("|")
    # largest size (4K): busbw GB/s, algbw GB/s, then x8 for Gbps as the seeds print
    assert [c.strip() for c in one[1:9]] == ["1", "2", "4K", "0.03", "0.02", "0.2", "0.2", "0.02"]
    assert [c.strip() for c in two[1:6]] == ["2", "4", "4K", "0.06", "0.04"]
    assert "| 1K | 0.010 | 0.020 |" in md
    assert "all_gather" not in md


def test_write_report_makes_markdown_and_png(tmp_path: Path) -> None:
    need("matplotlib")
    for n in (1, 2, 3):
        make_result(n, scale=n).save(tmp_path / f"bench-{n}n.json")
    md, png = write_report([tmp_path], tmp_path / "out")
    assert Path(md).read_text().count("\n| ") >= 6
    data = Path(png).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


@pytest.mark.parametrize(("text", "want"), [("1,2,4", [1, 2, 4]), ("1-3", [1, 2, 3]), ("2, 1,2", [2, 1])])
def test_parse_nodes(text: str, want: list[int]) -> None:
    assert parse_nodes(text) == want


@pytest.mark.parametrize("text", ["", "0", "a", "1,x", "-1"])
def test_parse_nodes_rejects(text: str) -> None:
    with pytest.raises(UsageError, match="--nodes"):
        parse_nodes(text)
