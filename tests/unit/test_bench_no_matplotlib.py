"""Without matplotlib, reports are Markdown only (a note, not an error about --plot); sweeps never fail for it."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import need
from tests.unit.test_bench_report import make_result
from torchhpc.bench import sweep
from torchhpc.cli.main import main


@pytest.fixture
def no_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(sys.modules):
        if name == "matplotlib" or name.startswith("matplotlib."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails, find_spec finds nothing


def _saved(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    data.mkdir()
    for n in (1, 2):
        make_result(n, scale=n).save(data / f"bench-{n}n.json")
    return data


def test_write_report_skips_the_png(no_matplotlib: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    md, png = sweep.write_report([_saved(tmp_path)], tmp_path / "out")
    assert png is None and not (tmp_path / "out" / sweep.REPORT_PNG).exists()
    text = Path(md).read_text()
    assert text.count("\n| ") >= 4 and sweep.REPORT_PNG not in text  # no link to an image that is not there
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("Note: busbw.png not written: matplotlib is not installed")
    assert "--plot" not in err[0]


def test_bench_report_without_plot_succeeds(no_matplotlib: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["bench", "report", str(_saved(tmp_path)), "-o", str(tmp_path / "out")])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "Error" not in err and "--plot" not in err and "matplotlib is not installed" in err
    assert "| nodes |" in out and (tmp_path / "out" / sweep.REPORT_MD).exists()


def test_sweep_without_matplotlib_reports_markdown(
    no_matplotlib: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The jobs' JSON is the result: a missing matplotlib must not turn a finished sweep into a failure."""
    ran: list[int] = []

    def fake_run_sweep(jobs: Sequence[sweep.SweepJob], scheduler: Any, **_: Any) -> list[str]:
        for job in jobs:
            ran.append(job.nodes)
            make_result(job.nodes).save(job.json_path)
        return []

    monkeypatch.setattr(sweep, "run_sweep", fake_run_sweep)
    monkeypatch.setenv("HOME", str(tmp_path))
    rc = main(["bench", "sweep", "-N", "1", "--out", str(tmp_path / "sweep"), "--", "-b", "1K", "-e", "4K"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert ran == [1] and "Report: " in out and "Plot:" not in out
    assert "matplotlib is not installed" in err and "Error" not in err


def test_write_report_with_matplotlib_links_the_png(tmp_path: Path) -> None:
    need("matplotlib")
    md, png = sweep.write_report([_saved(tmp_path)], tmp_path / "out")
    assert png is not None and Path(png).exists() and f"]({sweep.REPORT_PNG})" in Path(md).read_text()
