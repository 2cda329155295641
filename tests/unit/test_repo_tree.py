"""What must never be committed: the output of a job run inside the checkout."""

from __future__ import annotations

import shutil
import subprocess

from tests.conftest import REPO, missing


def test_no_rank_output_is_tracked() -> None:
    """Every job writes <output-dir>/<name>-<id>/ranks/rank-N@host.log; one run from the repository root
    once left such a tree (q7ph/train-42/ranks/) in a commit. A file under any ranks/ directory is job output."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        missing("git or the repository's .git is not here")
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout.decode()
    tracked = [f for f in files.split("\0") if f]
    assert tracked, "git ls-files listed nothing"
    stray = [f for f in tracked if "ranks" in f.split("/")[:-1]]
    assert not stray, f"job output is tracked (git rm it): {stray}"
