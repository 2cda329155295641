"""``torchhpc events``: an incident's recompute starts when the newest checkpoint before its fault was complete.

The completion times come from ``<job dir>/checkpoint.json`` (torchhpc.dist.checkpoint's last
completions) and from the complete checkpoints in the directory it names (their mtimes).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from torchhpc.diagnose.account import account
from torchhpc.diagnose.events import _with_checkpoint_times

T = 1_000_000.0
ATTEMPTS: list[dict[str, Any]] = [
    {"attempt": 0, "started": T, "first_line": T + 10, "fault": T + 60, "ended": T + 62, "class": "network",
     "found_by": "step-end", "checkpoint_step": 4},
    {"attempt": 1, "started": T + 65, "first_line": T + 70, "ended": T + 100, "class": None},
]


def _marker(job: Path, ckpt: Path, **fields: Any) -> None:
    job.mkdir(exist_ok=True)
    (job / "checkpoint.json").write_text(json.dumps({"step": 5, "path": str(ckpt / "ckpt-000000005"), **fields}))


def test_the_newest_completion_before_the_fault_starts_the_recompute(tmp_path: Path) -> None:
    _marker(tmp_path / "job", tmp_path / "ck", time=T + 70, completed=[[3, T + 20], [4, T + 50], [5, T + 70]])
    rows = _with_checkpoint_times(str(tmp_path / "job"), ATTEMPTS)
    assert rows[0]["checkpoint_time"] == T + 50 and "checkpoint_time" not in rows[1]  # a success needs none
    inc = account(T - 5, T, T + 100, rows).incidents[0]
    assert inc.recompute_known and inc.recompute_s == 10.0  # the fault at +60, the checkpoint done at +50


def test_without_a_history_the_complete_directories_mtimes_count(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    for step, when in ((3, T + 30), (4, T + 45), (9, T + 58)):
        d = ck / f"ckpt-{step:09d}"
        d.mkdir(parents=True)
        if step != 9:  # step 9 has no .metadata: a torn directory, not a checkpoint
            (d / ".metadata").write_bytes(b"")
        os.utime(d, (when, when))
    torn = ck / ".ckpt-000000005.abc.tmp"
    torn.mkdir()
    os.utime(torn, (T + 59, T + 59))
    _marker(tmp_path / "job", ck, time=T + 80)  # the old helper's marker: the last completion only
    rows = _with_checkpoint_times(str(tmp_path / "job"), ATTEMPTS)
    assert rows[0]["checkpoint_time"] == T + 45


def test_a_recorded_time_wins_and_no_marker_changes_nothing(tmp_path: Path) -> None:
    _marker(tmp_path / "job", tmp_path / "ck", time=T + 50)
    recorded = [{**ATTEMPTS[0], "checkpoint_time": T + 40}, ATTEMPTS[1]]
    assert _with_checkpoint_times(str(tmp_path / "job"), recorded)[0]["checkpoint_time"] == T + 40
    assert _with_checkpoint_times(str(tmp_path / "none"), ATTEMPTS) == ATTEMPTS
