"""A local sweep read back like a Slurm one (issue 51, item 8): each task's own state, exit code, elapsed
time and RESULT metrics, through `torchhpc sweep status` and `sweep report` (real runs, local scheduler)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from tests.cli_run import torchhpc
from tests.conftest import need

PROG = ("import json, sys, time\nlr = float(sys.argv[1])\ntime.sleep(0.3)\nif lr > 0.15:\n    raise SystemExit(3)\n"
        "print('RESULT ' + json.dumps({'accuracy': 1 - lr, 'epochs': [{'loss': 0.5}]}), flush=True)\n")


def test_a_local_sweep_reads_each_tasks_state_exit_elapsed_and_result(clean_user_env: None, tmp_path: Path) -> None:
    (tmp_path / "sw.py").write_text(PROG)
    env = dict(os.environ)
    r = torchhpc(env, "sweep", "--grid", "lr=0.1,0.2", "--output-dir", str(tmp_path / "swp"), "--wait", "-n", "1",
                 "--python", sys.executable, "sw.py", "{lr}", cwd=tmp_path, timeout=200)
    assert r.returncode != 0, r.stdout + r.stderr  # task 1 fails by design
    rows = json.loads(torchhpc(env, "sweep", "status", str(tmp_path / "swp"), "--json", cwd=tmp_path).stdout)
    # it was FAILED for both, exit None, elapsed "", no result columns
    got = [(t["task"], t["state"], t["exit_code"], t.get("result.accuracy"), t.get("result.loss")) for t in rows]
    assert got == [(0, "COMPLETED", 0, 0.9, 0.5), (1, "FAILED", 3, None, None)], rows
    assert all(t["elapsed"].endswith("s") and float(t["elapsed"][:-1]) >= 0.3 for t in rows), rows
    text = torchhpc(env, "sweep", "status", str(tmp_path / "swp"), cwd=tmp_path).stdout
    assert "None" not in text and "result.accuracy" in text, text


def test_a_report_without_a_metric_says_so(clean_user_env: None, tmp_path: Path) -> None:
    need("matplotlib", "the report's reason is about the metric only where matplotlib is there")
    (tmp_path / "quiet.py").write_text("import sys\nprint('lr', sys.argv[1])\n")
    env = dict(os.environ)
    r = torchhpc(env, "sweep", "--grid", "lr=0.1,0.2", "--output-dir", str(tmp_path / "q"), "--wait", "-n", "1",
                 "--python", sys.executable, "quiet.py", "{lr}", cwd=tmp_path, timeout=200)
    assert r.returncode == 0, r.stdout + r.stderr
    rep = torchhpc(env, "sweep", "report", str(tmp_path / "q"), cwd=tmp_path)
    assert rep.returncode == 0, rep.stderr
    assert "no task printed a RESULT line with a number" in rep.stderr and "matplotlib" not in rep.stderr, rep.stderr
