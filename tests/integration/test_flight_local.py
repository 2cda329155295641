"""The Flight Recorder verdict of real 4-rank gloo jobs under the local scheduler (issue 51, items 1-2).

Nothing is faked: ``torchhpc run -n 4`` starts four ranks of tests/integration/scripts/planted_collective.py,
the hang watch asks every rank for its dump, and the verdict and the timeline are read back through the CLI.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from tests.cli_run import torchhpc
from tests.conftest import hang_timeout
from tests.integration.test_diagnose_cluster import PLANTED
from tests.integration.test_local_restarts import _handle


def test_a_skipped_all_gather_is_named_by_its_number(clean_user_env: None, tmp_path: Path) -> None:
    """Rank 1 skips one all_gather (accelerate's uneven-loop bug): it never entered all_gather #5, where
    ranks 0, 2 and 3 wait. It was "size mismatch in all_gather #4: ranks 0,2-3 passed [[4]], rank 1 passed [[4]]"."""
    r = torchhpc(dict(os.environ), "run", "-n", "4", "--hang-timeout", hang_timeout(8), PLANTED, "skip", "1", "all_gather",
                 cwd=tmp_path, timeout=300)
    assert r.returncode != 0
    want = "hang — rank 1 never entered all_gather #5 (pg 0); ranks 0,2-3 have waited in it"
    assert f"diagnosis: {want}" in r.stderr, r.stderr
    assert "size mismatch" not in r.stderr, r.stderr
    v = json.loads(torchhpc(dict(os.environ), "diagnose", _handle(r.stderr), "--json", cwd=tmp_path).stdout)
    assert v["class"] == "hang" and v["summary"].startswith(want.split(" — ")[1]), v
    assert v["first"]["rank"] == 1 and v["consequences"] == [0, 2, 3], v


def test_a_job_that_completed_has_no_flight_finding(clean_user_env: None, tmp_path: Path) -> None:
    """Every rank finishes and exits without destroy_process_group (as the Hugging Face Trainer does): their
    exit dumps are in fr/, and neither `events` nor `diagnose` reports a finding (it was
    "flight mismatch-size: size mismatch in all_gather #5 (pg 0): rank  passed [[4]], ranks 0-3 passed [[4]]")."""
    env = dict(os.environ)
    sub = torchhpc(env, "run", "-n", "4", "--background", PLANTED, "finish", "1", "all_gather", cwd=tmp_path)
    m = re.search(r"Submitted (local:\S+)", sub.stdout)
    assert m, sub.stdout + sub.stderr
    w = torchhpc(env, "wait", m.group(1), cwd=tmp_path, timeout=200)
    assert w.returncode == 0, w.stdout + w.stderr
    left = sorted(p.name for p in tmp_path.rglob("fr/rank-*.left"))  # the job's state is under the test's HOME
    assert left == [f"rank-{r}.left" for r in range(4)], left  # the exit dumps a completed job leaves
    ev = torchhpc(env, "events", m.group(1), "--json", cwd=tmp_path)
    assert ev.returncode == 0, ev.stderr
    kinds = [e["kind"] for e in json.loads(ev.stdout)["events"]]
    assert "flight" not in kinds and kinds[-1] == "end", kinds
    text = torchhpc(env, "events", m.group(1), cwd=tmp_path).stdout
    assert "mismatch" not in text and "rank  " not in text, text
    d = torchhpc(env, "diagnose", m.group(1), cwd=tmp_path)
    assert d.returncode == 0 and "no failure" in d.stdout, d.stdout + d.stderr


SUBGROUP = str(Path(__file__).parent / "scripts" / "planted_subgroup.py")


def test_a_skip_inside_a_pair_names_the_rank_that_skipped(clean_user_env: None, tmp_path: Path) -> None:
    """Issue 65: pairs {0,1},{2,3}; rank 3 skips its pair's all_reduce and waits in the world's. It blamed
    rank 2 (only waiting, in the pair's call) and said three ranks waited in a collective of two."""
    r = torchhpc(dict(os.environ), "run", "-n", "4", "--hang-timeout", hang_timeout(8), SUBGROUP, "pairs", "skip", "3",
                 cwd=tmp_path, timeout=300)
    assert r.returncode != 0
    want = ("hang — rank 3 never entered all_reduce #4 of the group of ranks 2,3 (pg 2); rank 2 has waited in it")
    assert f"diagnosis: {want}" in r.stderr, r.stderr
    assert "so ranks 0-1,3 wait for rank 2 in the world's all_reduce #4 (pg 0)" in r.stderr, r.stderr
    assert "ranks 0-2 have waited" not in r.stderr, r.stderr
    v = json.loads(torchhpc(dict(os.environ), "diagnose", _handle(r.stderr), "--json", cwd=tmp_path).stdout)
    assert v["class"] == "hang" and v["first"]["rank"] == 3, v
