"""Done is done (issue 65): a local job whose ranks finished their program and then hang at exit
completes; a rank that hangs before its program returned is still a hang.

Nothing is faked: two real gloo ranks of tests/integration/scripts/exit_hang.py run under
``torchhpc run -n 2 --hang-timeout 15``; the rank boot marks each one's return and the hang watch
reads the marks.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.cli_run import torchhpc
from tests.conftest import hang_timeout, left_running
from torchhpc.core.exitcodes import EXIT_CODES

EXIT_HANG = str(Path(__file__).parent / "scripts" / "exit_hang.py")


def test_ranks_that_hang_after_their_program_ended_complete_the_job(clean_user_env: None, tmp_path: Path) -> None:
    """Both ranks block 60 s in an atexit handler after their last line: COMPLETED, exit 0, and the
    hang-at-exit line names each rank and where it stopped (it was FAILED as a hang after 15 s)."""
    r = torchhpc(dict(os.environ), "run", "-n", "2", "--hang-timeout", hang_timeout(15), EXIT_HANG, "exit", "60", "--wait",
                 cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("FINISHED sum=2") == 2, r.stdout
    for rank in (0, 1):
        assert f"torchhpc: hang at exit: rank {rank} stopped " in r.stderr, r.stderr
    assert "after its program ended: stuck_teardown (exit_hang.py:" in r.stderr, r.stderr
    [job] = (tmp_path / "state" / "jobs" / "local").iterdir()  # a foreground success names no handle
    st = json.loads(torchhpc(dict(os.environ), "status", f"local:{job.name}", "--json", cwd=tmp_path).stdout)
    assert (st["state"], st["exit_code"]) == ("COMPLETED", 0), st
    assert "hung at exit: rank 0 stopped" in st["reason"], st
    assert left_running(EXIT_HANG, tmp_path) == []


def test_a_rank_that_blocks_before_its_program_returned_is_still_a_hang(clean_user_env: None, tmp_path: Path) -> None:
    """Rank 0 returns and marks it; rank 1 sleeps before its program's end: not every rank returned."""
    r = torchhpc(dict(os.environ), "run", "-n", "2", "--hang-timeout", hang_timeout(15), EXIT_HANG, "before", "60", "--wait",
                 cwd=tmp_path, timeout=300)
    assert r.returncode == EXIT_CODES["hang"], r.stdout + r.stderr
    assert "hang at exit" not in r.stderr, r.stderr
    assert "diagnosis: hang" in r.stderr and "culprit: rank 1" in r.stderr, r.stderr
    assert left_running(EXIT_HANG, tmp_path) == []
