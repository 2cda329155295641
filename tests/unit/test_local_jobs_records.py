"""Local job records (``jobs/local/<id>/record.json``) that are not what torchhpc wrote."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torchhpc.cli.main import main
from torchhpc.errors import SchedulerError
from torchhpc.schedulers.local.jobs import RECORD, LocalJobs, jobs_root


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TORCHHPC_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def _job(job_id: str, content: str | bytes) -> Path:
    d = jobs_root() / job_id
    d.mkdir(parents=True)
    if isinstance(content, bytes):
        (d / RECORD).write_bytes(content)
    else:
        (d / RECORD).write_text(content)
    return d


def _done(job_id: str) -> None:
    _job(job_id, json.dumps({"job_id": job_id, "name": "ok", "state": "COMPLETED", "exit_code": 0, "submitted": 1.0, "started": 1.0, "ended": 3.0}))


@pytest.mark.parametrize("content", ["[1, 2]", '"text"', "3", "null"])
def test_a_record_that_is_not_an_object_is_unreadable(content: str) -> None:
    _job("bad", content)
    with pytest.raises(SchedulerError) as e:
        LocalJobs().status("bad")
    assert "the record of local:bad cannot be read" in e.value.message and "not an object" in e.value.message
    assert e.value.hint


@pytest.mark.parametrize(
    "content",
    ["[1, 2]", "{not json", b"\xff\xfe{}", '{"state": "RUNNING", "pid": "x"}', '{"state": "DONE", "started": "soon"}'],
)
def test_list_skips_unreadable_records(content: str | bytes, capsys: pytest.CaptureFixture[str]) -> None:
    _done("good")
    _job("bad", content)
    (jobs_root() / "stray-file").write_text("")
    (jobs_root() / "no-record").mkdir()
    jobs = LocalJobs().list_jobs()
    assert [j.job_id for j in jobs] == ["good"] and jobs[0].elapsed == "2.0s"
    err = capsys.readouterr().err
    assert err.startswith("Warning: skipped local:bad: the record of local:bad cannot be read")


def test_cli_list_and_status_with_a_list_record(capsys: pytest.CaptureFixture[str]) -> None:
    _done("good")
    _job("bad", "[1, 2]")
    assert main(["list", "-s", "local"]) == 0
    out, err = capsys.readouterr()
    assert "local:good" in out and "bad" not in out and "Warning: skipped local:bad" in err
    assert main(["status", "local:bad"]) != 0
    err = capsys.readouterr().err
    assert err.startswith("Error: the record of local:bad cannot be read") and "Traceback" not in err


def test_last_is_the_newest_submitted_not_the_newest_written(capsys: pytest.CaptureFixture[str]) -> None:
    """Reading a job's status may write its record (a vanished supervisor is recorded FAILED): an older job
    written after the newest one must not become `list --last` (the exit-contract tests' handle came out wrong)."""
    import os

    for job_id, submitted in (("older", 100.0), ("newer", 200.0)):
        _job(job_id, json.dumps({"job_id": job_id, "name": job_id, "state": "COMPLETED", "exit_code": 0,
                                 "submitted": submitted, "started": submitted, "ended": submitted + 1}))
    os.utime(jobs_root() / "older" / RECORD, (1e9 + 10, 1e9 + 10))
    os.utime(jobs_root() / "newer" / RECORD, (1e9, 1e9))
    assert [j.job_id for j in LocalJobs().list_jobs()] == ["older", "newer"]
    assert main(["list", "--last"]) == 0
    assert capsys.readouterr().out == "local:newer\n"  # --last: the handle alone
