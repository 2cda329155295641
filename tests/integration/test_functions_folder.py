"""What an Executor's jobs leave in the working directory on the dev cluster: one folder.

Two real sbatch submissions from a notebook-like session (one function raises), srun
starting real ranks on two namespace nodes; then the working directory is listed. The
functions are defined inside the test, so cloudpickle sends them by value and the ranks
need not import this module from the scratch working directory. Nothing is mocked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import torchhpc

pytestmark = pytest.mark.cluster("slurm")


def test_two_submits_one_failing_leave_only_the_folder_with_each_job_inside_its_function_dir(
    slurm_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for k, v in slurm_cluster.client_env().items():
        monkeypatch.setenv(k, v)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)

    def f(x: int) -> int:
        return x + 1

    def bad(x: int) -> int:
        raise ValueError(f"bad {x}")

    ex = torchhpc.Executor(folder="runs", scheduler="slurm", nodes=2, launcher="srun")
    ok, failing = ex.submit(f, 41), ex.submit(bad, 1)
    assert ok.result(timeout=240) == 42
    with pytest.raises(torchhpc.JobFailed, match="ValueError: bad 1"):
        failing.result(timeout=240)
    assert [p.name for p in work.iterdir()] == ["runs"]
    homes = sorted((work / "runs").iterdir())
    assert homes == sorted(j.function_dir.path for j in (ok, failing))
    for job, name in ((ok, "f"), (failing, "bad")):  # the scheduler's job directory inside the function's
        inside = job.function_dir.path / f"{name}-{job.job_id}"
        assert (inside / "slurm.out").is_file() and list((inside / "ranks").glob("rank-*.log"))
        assert (job.function_dir.path / "fn.pkl").is_file()
