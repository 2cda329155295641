"""torchhpc sweep: grid expansion, the manifest, RESULT parsing and the report files (no cluster:
the status rows come from a fake runner answering scontrol as Slurm 22.05 does)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from torchhpc.core.array import last_result
from torchhpc.errors import UsageError
from torchhpc.sweep import flat_metrics, grid_rows, markdown, parse_grid, to_csv


def test_grid_rows_order_and_parse() -> None:
    grid = parse_grid(["lr=0.5,1.0", "seed=1,2,3"])
    rows = grid_rows(grid)
    assert len(rows) == 6 and rows[0] == {"lr": "0.5", "seed": "1"} and rows[1] == {"lr": "0.5", "seed": "2"}
    for bad in (["x"], ["1a=2"], ["index=1"], ["a=1", "a=2"], []):
        with pytest.raises(UsageError):
            parse_grid(bad)


def test_last_result_and_metrics() -> None:
    text = '0: RESULT {"a": 1}\n[rank0]: RESULT {"epochs": [{"accuracy": 0.1}, {"accuracy": 0.9}], "world_size": 2}\nbye\n'
    res = last_result(text)
    assert flat_metrics(res) == {"accuracy": 0.9, "world_size": 2}
    assert last_result("RESULT {bad\n") is None
    rows = [{"task": 0, "lr": "a|b", "result.accuracy": 0.9}]
    assert "a\\|b" in markdown(rows) and to_csv(rows).splitlines()[0] == "task,lr,result.accuracy"


def test_dry_run_prints_script_and_manifest(tmp_path: Path) -> None:
    """Hostile values (quotes, $(...), &, spaces) appear in the manifest exactly."""
    (tmp_path / "t.py").write_text("")
    odd = "a'b $(touch pwned) &x"
    out = subprocess.run(
        [sys.executable, "-m", "torchhpc", "sweep", "--scheduler", "slurm", "--grid", f"lr=0.5,{odd}",
         "--grid", "seed=1,2", "--parallel", "2", "--output-dir", str(tmp_path / "sw"), "--dry-run",
         "--", "t.py", "--lr", "{lr}", "--seed", "{seed}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "#SBATCH --array=0-3%2" in out.stdout and "%A_%a.out" in out.stdout
    tasks = json.loads(out.stdout.strip().splitlines()[-1])
    assert [t["params"] for t in tasks] == [{"lr": "0.5", "seed": "1"}, {"lr": "0.5", "seed": "2"},
                                            {"lr": odd, "seed": "1"}, {"lr": odd, "seed": "2"}]
    assert not os.path.exists(tmp_path / "sw") and not os.path.exists(tmp_path / "pwned")


def test_grid_json_list_for_values_with_commas() -> None:
    assert parse_grid(['t=["a,b", "c", 0.001]']) == [("t", ["a,b", "c", "0.001"])]
    for bad in ['t=[', "t=[]", 't=[{"a": 1}]']:
        with pytest.raises(UsageError):
            parse_grid([bad])


def test_python_api_array_and_sweep_render(tmp_path: Path) -> None:
    from tests.fakes import FakeRunner
    from torchhpc.job import Job
    from torchhpc.sweep import Sweep

    job = Job(["t.py", "--seed", "{index}"], scheduler="slurm", array="0-7%2", output_dir=str(tmp_path), runner=FakeRunner())
    assert "#SBATCH --array=0-7%2" in (job.render().script or "")
    sw = Sweep(["t.py", "--lr", "{lr}"], grid={"lr": [0.5, 1.0], "seed": [1, 2, 3]}, parallel=2, scheduler="pbs",
               output_dir=str(tmp_path), runner=FakeRunner())
    assert sw.spec.array == "0-5%2" and "#PBS -J 0-5%2" in (sw.render().script or "")
    man = sw.manifest()
    assert man["params"] == ["lr", "seed"] and man["tasks"][5] == {"index": 5, "params": {"lr": "1.0", "seed": "3"}}
