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


def test_each_incident_says_where_the_next_attempt_resumed_and_the_steps_lost(tmp_path: Path) -> None:
    """Issue 68: memory saves every step (step, time, tier); the helper's resume after the fault (time, step,
    where from): the incident names the resumed step, its tier and the saved steps it went back past."""
    completed = [[s, T + 10 + 5 * s, "memory"] for s in range(1, 10)] + [[5, T + 38, "disk"]]
    _marker(tmp_path / "job", tmp_path / "ck", time=T + 55, completed=completed, resumed=[[T + 71, 9, "peer"]])
    rows = _with_checkpoint_times(str(tmp_path / "job"), ATTEMPTS)
    assert (rows[0]["last_step"], rows[0]["resumed_step"], rows[0]["resumed_from"]) == (9, 9, "peer")
    inc = account(T - 5, T, T + 100, rows).incidents[0]
    assert (inc.resumed_step, inc.resumed_from, inc.steps_lost) == (9, "peer", 0)
    assert inc.resume_note() == ", resumed step 9 from a peer's memory copy (0 steps lost)"
    assert inc.to_json()["steps_lost"] == 0
    # the same fault resumed from disk's step 5: the memory's steps 6-9 were lost
    _marker(tmp_path / "job", tmp_path / "ck", time=T + 55, completed=completed, resumed=[[T + 71, 5, "disk"]])
    inc = account(T - 5, T, T + 100, _with_checkpoint_times(str(tmp_path / "job"), ATTEMPTS)).incidents[0]
    assert inc.resume_note() == ", resumed step 5 from disk (4 steps lost)"
    # a resume before the fault (the first attempt's own) is not this incident's
    _marker(tmp_path / "job", tmp_path / "ck", time=T + 55, completed=completed, resumed=[[T + 5, 0, "disk"]])
    assert account(T - 5, T, T + 100, _with_checkpoint_times(str(tmp_path / "job"), ATTEMPTS)).incidents[0].resume_note() == ""
