"""What an Executor's jobs leave in the working directory: one folder, as submitit's ``folder=``.

Real local jobs (the local scheduler's processes, real ranks, cloudpickle both ways): two
submissions, one of which raises, and then the working directory is listed. The functions
are defined inside the tests, so cloudpickle sends them by value and the ranks need not
import this module from a working directory that is not the repository.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import torchhpc
from torchhpc.functions.executor import DEFAULT_FOLDER

pytestmark = pytest.mark.usefixtures("clean_user_env")


def _two_submits(ex: torchhpc.Executor) -> list[torchhpc.FunctionJob]:
    def double(x: int) -> int:
        return 2 * x

    def bad(x: int) -> int:
        raise ValueError(f"bad {x}")

    ok, failing = ex.submit(double, 21), ex.submit(bad, 1)
    assert ok.result(timeout=120) == 42
    with pytest.raises(torchhpc.JobFailed, match="ValueError: bad 1"):
        failing.result(timeout=120)
    return [ok, failing]


@pytest.mark.parametrize("folder", ["runs", None])
def test_two_submits_one_failing_leave_only_the_folder_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, folder: str | None
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    jobs = _two_submits(torchhpc.Executor(folder=folder, scheduler="local"))
    home = work / (folder or DEFAULT_FOLDER)
    assert sorted(p.name for p in work.iterdir()) == [home.name]
    assert sorted(p.name for p in home.iterdir()) == sorted(j.function_dir.path.name for j in jobs)
    for job in jobs:  # each submission's files in its own directory: the pickle and the ranks' records
        assert job.function_dir.path.parent == home
        assert (job.function_dir.path / "fn.pkl").is_file() and job.function_dir.records()


def test_folder_defaults_to_output_dir_and_the_job_directory_lies_inside_the_function_directory(tmp_path: Path) -> None:
    ex = torchhpc.Executor(scheduler="slurm", nodes=2, launcher="srun", output_dir=str(tmp_path / "out"))
    notes = "\n".join(ex.render(print, 1).notes)
    fdir = next(line.split("function pickle: ", 1)[1].split("/fn.pkl")[0] for line in notes.splitlines() if "function pickle" in line)
    assert Path(fdir).parent == tmp_path / "out"
    assert f"job directory: {fdir}/print-<job id>/" in notes
    ex.update_parameters(folder=str(tmp_path / "elsewhere"))
    assert f"job directory: {tmp_path / 'elsewhere'}/print-fn-" in "\n".join(ex.render(print, 1).notes)


def test_empty_folder_is_refused_with_a_hint() -> None:
    with pytest.raises(torchhpc.errors.SpecError, match="names no directory"):
        torchhpc.Executor(folder=" ", scheduler="local")
