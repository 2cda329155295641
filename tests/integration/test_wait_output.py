"""``run --wait`` shows what it waited for (issue 26, item 6), on the real dev cluster.

Nothing faked: sbatch --array, the task's own ranks/ files, scontrol/sacct for the states.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.cli_run import torchhpc
from tests.conftest import PYTHON

pytestmark = pytest.mark.cluster("slurm")

PRINT_INDEX = """import os
print("index", os.environ["TORCHHPC_ARRAY_INDEX"], "rank", os.environ["RANK"], flush=True)
"""


def test_array_wait_prints_every_task_labelled(slurm_cluster: Any, tmp_path: Path) -> None:
    """4 tasks, 2 at a time: the screen after --wait holds each task's line, labelled [task I] as the
    local scheduler labels them, with its rank (one prefix, not two)."""
    script = tmp_path / "idx.py"
    script.write_text(PRINT_INDEX)
    done = torchhpc(slurm_cluster, "run", "--scheduler", "slurm", "--launcher", "srun", "--array", "0-3%2",
                     "--output-dir", str(tmp_path), "--python", PYTHON, str(script), "--wait", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    for i in range(4):
        assert re.search(rf"^\[task {i}\] \[rank0\]: index {i} rank 0$", done.stdout, re.M), done.stdout
    assert "4 COMPLETED" in done.stderr, done.stderr


def test_single_job_wait_prints_its_ranks_once_prefixed(slurm_cluster: Any, tmp_path: Path) -> None:
    """A rank line that already carries torch's [rankN]: prefix (as torch prints a failing rank's
    traceback) shows once prefixed, beside an ordinary line that gets torchhpc's prefix."""
    script = tmp_path / "pre.py"
    script.write_text('import os\nr = os.environ["RANK"]\nprint(f"[rank{r}]: torch-style", flush=True)\n'
                      'print(f"plain {r}", flush=True)\n')
    done = torchhpc(slurm_cluster, "run", "--scheduler", "slurm", "--launcher", "srun", "-n", "2",
                     "--output-dir", str(tmp_path), "--python", PYTHON, str(script), "--wait", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    for r in (0, 1):
        assert re.search(rf"^\[rank{r}\]: torch-style$", done.stdout, re.M), done.stdout
        assert re.search(rf"^\[rank{r}\]: plain {r}$", done.stdout, re.M), done.stdout
    assert "]: [rank" not in done.stdout, done.stdout


def test_cancel_of_a_finished_slurm_job_says_so(slurm_cluster: Any, tmp_path: Path) -> None:
    """Issue 26, item 7: scancel of an ended job is not reported as a cancel; exit 0."""
    done = torchhpc(slurm_cluster, "run", "--scheduler", "slurm", "--output-dir", str(tmp_path), "--wait",
                     "--", "true", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    job = re.search(r"Submitted slurm:(\d+)", done.stdout).group(1)  # type: ignore[union-attr]
    cancel = torchhpc(slurm_cluster, "cancel", f"slurm:{job}", cwd=tmp_path)
    assert cancel.returncode == 0, cancel.stderr
    assert f"slurm:{job} had already finished (COMPLETED" in cancel.stdout and "Cancelled" not in cancel.stdout, \
        cancel.stdout + cancel.stderr
