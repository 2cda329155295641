"""A scheduler command that is not installed is an Error with a HINT, never a bare `command not found`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import torchhpc.cli.jobs as jobs_cli
from tests.fakes import FakeRunner
from torchhpc.cli.main import main
from torchhpc.errors import CommandNotFound
from torchhpc.schedulers.pbs.pbs import PBSScheduler
from torchhpc.schedulers.slurm.slurm import SlurmScheduler

pytestmark = pytest.mark.usefixtures("clean_user_env")


def test_pbs_list_without_qstat_hints_at_the_login_node() -> None:
    runner = FakeRunner()  # answers nothing: every program is missing
    with pytest.raises(CommandNotFound) as e:
        PBSScheduler(runner=runner).list_jobs()
    assert e.value.hint == "is this a PBS login node? `qstat` should answer"
    assert len(runner.calls) == 1  # no second try of a program that is not there


def test_pbs_status_without_qstat_hints_too() -> None:
    runner = FakeRunner()
    with pytest.raises(CommandNotFound) as e:
        PBSScheduler(runner=runner).status("12.server")
    assert e.value.hint and "PBS login node" in e.value.hint
    assert len(runner.calls) == 1


def test_pbs_list_falls_back_to_plain_qstat_when_json_fails() -> None:
    answers = {"-F": (2, "", "qstat: invalid option -- 'F'\n")}
    runner = FakeRunner({"qstat": lambda argv, _in: answers.get(argv[2] if len(argv) > 2 else "", (0, "", ""))})
    assert PBSScheduler(runner=runner).list_jobs() == []
    assert [argv for argv, _ in runner.calls] == [["qstat", "-f", "-F", "json"], ["qstat", "-f"]]


def test_list_pbs_cli_without_qstat(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    rc = main(["list", "-s", "pbs"])
    err = capsys.readouterr().err.splitlines()
    assert rc == 1
    assert err == [
        "Error: `qstat -f -F json` exited with code 127: qstat: command not found",
        "HINT: is this a PBS login node? `qstat` should answer",
    ]


def test_list_cli_gives_a_hint_for_any_missing_command(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """squeue missing (a fake runner: no cluster is asked): the scheduler's own login-node hint."""

    def fake(name: str, runner: Any = None) -> Any:
        assert name == "slurm"
        return SlurmScheduler(runner=FakeRunner())

    monkeypatch.setattr(jobs_cli, "get_scheduler", fake)
    rc = main(["list", "-s", "slurm"])
    err = capsys.readouterr().err.splitlines()
    assert rc == 1 and err[0].startswith("Error: `squeue") and "command not found" in err[0]
    assert err[1:] == ["HINT: is this a Slurm login node? `sinfo` should answer"]
