"""One rank prefix per line (issue 26, item 6): torch already writes ``[rankN]:`` before a failing
rank's traceback; torchhpc must not add its own in front of it. The --wait side on a real cluster is
tests/integration/test_wait_output.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from torchhpc.cli.follow import task_index
from torchhpc.cli.main import main
from torchhpc.jobdir.logs import Line

TORCH_STYLE = "import os; r = os.environ['RANK']; print(f'[rank{r}]: Traceback (torch)'); print(f'plain {r}')"


def test_a_line_torch_prefixed_is_shown_once() -> None:
    assert Line(2, "[rank2]: Traceback (most recent call last):").show() == "[rank2]: Traceback (most recent call last):"
    assert Line(2, "loss=1").show() == "[rank2]: loss=1"
    assert Line(2, "[rank3]: relayed").show() == "[rank2]: [rank3]: relayed"  # another rank's words: who said it
    assert Line(None, "[rank1]: x").show() == "[rank1]: x"


@pytest.mark.usefixtures("clean_user_env")
def test_local_run_prefixes_once(capfd: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "-n", "2", "--", sys.executable, "-c", TORCH_STYLE]) == 0
    out = capfd.readouterr().out
    for r in (0, 1):
        assert f"[rank{r}]: Traceback (torch)\n" in out and f"[rank{r}]: plain {r}\n" in out, out
    assert "]: [rank" not in out, out


def test_task_index_of_slurm_and_pbs_ids() -> None:
    assert task_index("29_3") == "3" and task_index("29[12].pbs01") == "12" and task_index("29") == "29"


@pytest.mark.parametrize("kept_in_job_dir", [True, False])
def test_array_task_directory_beside_the_array_whatever_holds_the_script(
    kept_in_job_dir: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task's ranks/ is <output-dir>/<name>-ARRAY_TASK (made by the task's batch shell), also when the
    submitted script is kept in the array's own directory (<output-dir>/<name>-ARRAY/job.sbatch)."""
    from torchhpc.jobdir.logs import task_record
    from torchhpc.jobdir.record import JobRecord, save_record

    monkeypatch.setenv("TORCHHPC_STATE_DIR", str(tmp_path / "state"))
    script = tmp_path / "out" / ("idx-7/job.sbatch" if kept_in_job_dir else "idx.sbatch")
    save_record(JobRecord(scheduler="slurm", job_id="7", name="idx", script=str(script), array=True))
    assert task_record("slurm", "7_3").job_dir == str(tmp_path / "out" / "idx-7_3")
