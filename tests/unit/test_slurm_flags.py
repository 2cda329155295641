"""A Slurm user's own flags given to ``torchhpc run`` (issue 70's wording list): torchhpc's name for each."""

from __future__ import annotations

import pytest

from torchhpc.cli.main import main


@pytest.mark.parametrize(("flag", "spelled"), [
    (["--exclusive"], "--opt exclusive=1"),  # was "did you mean --exclude?"
    (["--gres", "gpu:1"], "--gpus-per-node N, or --opt gres=gpu:N"), (["--mail-user", "a@b"], "--opt mail_user=VALUE"),
    (["--cpus-per-task", "4"], "--cpus-per-proc N"), (["-J", "x"], "--name NAME"), (["-p", "debug"], "--partition NAME"),
])
def test_sbatchs_own_flag_names_torchhpcs(flag: list[str], spelled: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["run", "--scheduler", "slurm", *flag, "train.py"])
    assert e.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"Error: torchhpc run: unknown flag {flag[0]}: that is sbatch's; here it is {spelled} " \
                     "(`torchhpc options slurm`)", err


def test_a_typo_still_gets_the_nearest_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["run", "--nodse", "2", "train.py"])
    assert "did you mean --nodes?" in capsys.readouterr().err


def test_background_is_refused_on_slurm_not_silently_taken(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--scheduler", "slurm", "--background", "--dry-run", "train.py"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("Error: --background: a slurm job runs in the background already"), err


@pytest.mark.parametrize(("given", "seconds"), [("300", 300), ("300s", 300), ("5m", 300), ("1h30m", 5400),
                                                ("00:05:00", 300)])
def test_signal_before_takes_a_duration(given: str, seconds: int) -> None:
    """Issue 70's docs list: `--signal-before 5m` got argparse's "invalid int value"."""
    from torchhpc.core.units import parse_seconds

    assert parse_seconds(given) == seconds


def test_signal_before_5m_renders_300_seconds(clean_user_env: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--scheduler", "slurm", "--time", "02:00:00", "--signal-before", "5m", "--dry-run",
                 "examples/pi.py"]) == 0
    assert "#SBATCH --signal=B:USR2@300" in capsys.readouterr().out


def test_slurms_min_max_node_count_is_said_in_torchhpcs_terms(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["run", "--scheduler", "slurm", "--nodes", "2-4", "train.py"])
    err = capsys.readouterr().err.splitlines()[0]
    assert err.startswith("Error: torchhpc run: --nodes '2-4' is Slurm's min-max node count") and "--nodes 4" in err, err
