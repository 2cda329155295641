"""``torchhpc events`` of a real local job with one restart: 2 gloo ranks, rank 1 hangs on the first
attempt (tests/integration/scripts/hang_once.py), the hang watch cancels it, the second attempt
completes. Nothing is faked: the record, attempts.json, hang.json and the ranks' Flight Recorder
dumps are the ones the run leaves.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.cli_run import torchhpc
from tests.conftest import hang_timeout, need
from tests.integration.test_local_restarts import HANG_ONCE, _handle


def test_events_of_a_local_job_with_a_restart(clean_user_env: None, tmp_path: Path) -> None:
    need("matplotlib", "the PNG needs the plot extra")
    r = torchhpc(dict(os.environ), "run", "-n", "2", "--hang-timeout", hang_timeout(5), "--max-restarts", "1", HANG_ONCE, "1",
                 cwd=tmp_path, timeout=200)
    assert r.returncode == 0, r.stdout + r.stderr
    handle = _handle(r.stderr)
    shown = torchhpc(dict(os.environ), "events", handle, "--json", "--plot", str(tmp_path / "ev.png"), cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    out = json.loads(shown.stdout)
    kinds = [e["kind"] for e in out["events"]]
    assert kinds[0] == "submit" and kinds[-1] == "end" and kinds.count("attempt") == 2, kinds
    assert {"start", "fault", "restart", "hang"} <= set(kinds), kinds
    fault = next(e for e in out["events"] if e["kind"] == "fault")
    assert fault["attempt"] == 0 and fault["text"].startswith("hang"), fault
    acct = out["account"]
    total = acct["queue_s"] + acct["startup_s"] + acct["productive_s"] + acct["lost_s"] + acct["shutdown_s"]
    assert abs(total - acct["wall_s"]) <= 1.0 and acct["incidents"] == 1, acct
    assert acct["lost_by_part_s"]["detection"] >= 5.0, acct  # the watch's --hang-timeout 5 of quiet
    assert (tmp_path / "ev.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = torchhpc(dict(os.environ), "events", handle, cwd=tmp_path).stdout
    assert text.splitlines()[-1].startswith("ETTR ") and "1 incident" in text.splitlines()[-1], text


def test_events_of_an_unsupervised_hang_count_it(clean_user_env: None, tmp_path: Path) -> None:
    """No --max-restarts, so no attempts.json: the hang is still an incident (it was "ETTR 100 %, 0 incidents"),
    and the plot draws the run's bar (it drew an empty axis)."""
    need("matplotlib", "the PNG needs the plot extra")
    r = torchhpc(dict(os.environ), "run", "-n", "2", "--hang-timeout", hang_timeout(5), HANG_ONCE, "1", "always",
                 cwd=tmp_path, timeout=200)
    assert r.returncode != 0, r.stdout + r.stderr
    handle = _handle(r.stderr)
    shown = torchhpc(dict(os.environ), "events", handle, "--json", "--plot", str(tmp_path / "ev.png"), cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    acct = json.loads(shown.stdout)["account"]
    assert acct["incidents"] == 1 and acct["incident_list"][0]["class"] == "hang", acct
    assert acct["ettr"] < 1.0 and acct["lost_by_part_s"]["detection"] >= 5.0, acct
    assert (tmp_path / "ev.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = torchhpc(dict(os.environ), "events", handle, cwd=tmp_path).stdout
    assert "1 incident" in text.splitlines()[-1] and "[]" not in text, text


HANG_AFTER_MEMORY_SAVES = """\
import time, torch, torchhpc.dist as thd
from torchhpc.dist import checkpoint
thd.init()
m = torch.nn.Linear(2, 2)
start = checkpoint.resume("ck", model=m).get("step", 0)
for step in range(start + 1, start + 4):
    checkpoint.save("ck", step=step, model=m, tier="memory")
    print("saved", step, flush=True)
if start == 0:
    time.sleep(600)  # the first attempt hangs after its third save
"""


def test_events_say_where_a_restart_resumed_from_memory(clean_user_env: None, tmp_path: Path) -> None:
    """Issue 68: the first attempt saves steps 1-3 to memory and hangs; the restart resumes step 3 from this
    node's memory; events' incident says so, with 0 saved steps lost."""
    prog = tmp_path / "memsave.py"
    prog.write_text(HANG_AFTER_MEMORY_SAVES)
    r = torchhpc(dict(os.environ), "run", "-n", "2", "--hang-timeout", hang_timeout(5), "--max-restarts", "1",
                 str(prog), cwd=tmp_path, timeout=300)
    assert r.returncode == 0 and "resumed step 3 from this node's memory" in r.stderr, r.stdout + r.stderr
    handle = _handle(r.stderr)
    out = json.loads(torchhpc(dict(os.environ), "events", handle, "--json", cwd=tmp_path).stdout)
    (incident,) = out["account"]["incident_list"]
    assert (incident["resumed_step"], incident["resumed_from"], incident["steps_lost"]) == (3, "memory", 0), incident
    text = torchhpc(dict(os.environ), "events", handle, cwd=tmp_path).stdout
    assert "resumed step 3 from memory (0 steps lost)" in text, text
