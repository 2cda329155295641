"""Handles on the Slurm side (issue 70, item 14): a bare number is not a local job, a word is not a Slurm id.

No cluster is asked: a bare ``353`` fails on the local records, ``slurm:abc`` before any Slurm command runs
(sacct's own refusal named its whole command line).
"""

from __future__ import annotations

import pytest

from torchhpc.cli.main import main


def test_a_bare_number_that_is_no_local_job_suggests_slurm(clean_user_env: None,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "353"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("Error: no job local:353") and err[1].startswith("HINT: did you mean slurm:353?"), err


def test_a_word_is_no_slurm_job_and_no_command_line_leaks(clean_user_env: None,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "slurm:abc"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("Error: no job slurm:abc (unknown to Slurm: a Slurm job id is a number"), err
    assert "sacct" not in err and "scontrol" not in err, err
