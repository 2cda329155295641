"""Errors that find the fix (issue 26, item 4) and cancel of a finished job (item 7).

Through the real entry point (``python -m torchhpc``) where the number of lines on the screen is
the point, through ``main()`` elsewhere.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO
from torchhpc.cli.main import main
from torchhpc.core.suggest import closest, did_you_mean, edit_distance
from torchhpc.errors import UsageError
from torchhpc.schedulers import parse_handle


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "torchhpc", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=60)


def test_edit_distance_counts_a_swap_as_one() -> None:
    assert edit_distance("nodse", "nodes") == 1
    assert edit_distance("slrum", "slurm") == 1
    assert edit_distance("", "abc") == 3 and edit_distance("kitten", "sitting") == 3
    assert closest("--nodse", ["--nodes", "--name", "--nproc-per-node"]) == ["--nodes"]
    assert closest("--gpu", ["--gpus-per-node", "--gpu-kind", "--wait"]) == ["--gpu-kind", "--gpus-per-node"]
    assert did_you_mean("--xyzzy", ["--nodes", "--wait"]) == ""


def test_run_typo_is_three_lines_at_most_with_the_flag() -> None:
    done = _cli("run", "--nodse", "2", "examples/pi.py")
    lines = (done.stdout + done.stderr).splitlines()
    assert done.returncode == 2
    assert 1 <= len(lines) <= 3, lines
    assert any("did you mean --nodes" in line for line in lines), lines
    assert lines[0].startswith("Error: ") and "--nodse" in lines[0] and lines[-1].startswith("HINT: usage: torchhpc run")


@pytest.mark.parametrize(("argv", "want"), [
    (["rnu", "x.py"], "did you mean run?"),
    (["net", "detekt"], "did you mean detect?"),
    (["logs", "--rnak", "3", "slurm:1"], "did you mean --rank?"),
    (["status", "--jsno", "slurm:1"], "did you mean --json?"),
    (["run", "--launcher", "torchrn", "x.py"], "did you mean torchrun?"),
    (["sweep", "--grdi", "a=1", "x.py"], "did you mean --grid?"),
])
def test_typos_name_the_nearest(argv: list[str], want: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert want in err and len(err.splitlines()) <= 3, err


def test_unknown_scheduler_prefix_is_named_with_the_nearest(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(UsageError) as e:
        parse_handle("slrum:1", "local")
    assert "'slrum' is not a scheduler" in e.value.message and "slurm, pbs" in e.value.message
    assert e.value.hint == "did you mean slurm:1?"
    assert main(["status", "slrum:1"]) == 2
    err = capsys.readouterr().err
    assert "slrum" in err and "did you mean slurm:1?" in err and "local:" not in err
    assert parse_handle("123", "pbs") == ("pbs", "123") and parse_handle("slurm:7_2") == ("slurm", "7_2")


@pytest.mark.usefixtures("clean_user_env")
@pytest.mark.parametrize(("argv", "warned"), [
    (["examples/pi.py", "--nodes", "2"], "--nodes"),
    (["examples/pi.py", "--steps", "5", "--scheduler=slurm", "--wait"], "--scheduler=slurm"),
    (["--", "examples/pi.py", "--nodes", "2"], ""),  # after --: the user said so
    (["-m", "torchhpc.bench", "all_reduce", "--json", "x.json"], ""),  # our own tool's flag of that name
    (["examples/pi.py", "-n", "2"], "-n"),  # issue 64: after a Python script, our short flags warn too
    (["true", "-n", "2"], ""),  # other programs' short flags are their own (nccl-tests)
])
def test_run_flag_after_the_program_warns_once_and_still_goes_to_it(
    argv: list[str], warned: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", "--dry-run", *argv]) == 0
    out, err = capsys.readouterr()
    warnings = [line for line in err.splitlines() if "after" in line and line.startswith("Warning:")]
    if warned:
        assert len(warnings) == 1 and warned in warnings[0] and "not to torchhpc" in warnings[0], err
        assert warned.split("=")[0] in out  # still the program's argument
    else:
        assert warnings == [], err


@pytest.mark.usefixtures("clean_user_env")
def test_cancel_of_a_finished_local_job_says_so_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--background", "-n", "1", "--", sys.executable, "-c", "pass"]) == 0
    handle = next(w for w in capsys.readouterr().out.split() if w.startswith("local:"))
    assert main(["wait", handle, "--timeout", "120"]) == 0
    capsys.readouterr()
    assert main(["cancel", handle]) == 0
    out = capsys.readouterr().out
    assert f"{handle} had already finished (COMPLETED, exit code 0): nothing to cancel" in out, out
    assert "Cancelled" not in out
    assert main(["status", handle]) == 0 and "COMPLETED" in capsys.readouterr().out  # not turned into CANCELLED


@pytest.mark.usefixtures("clean_user_env")
@pytest.mark.parametrize(("flag", "value", "near"), [
    ("--scheduler", "slrum", "did you mean slurm?"),
    ("--profile", "lumii", "did you mean lumi?"),
])
def test_mistyped_scheduler_and_profile_names(flag: str, value: str, near: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", flag, value, "--dry-run", "examples/pi.py"]) == 2
    err = capsys.readouterr().err
    assert f"{value!r}" in err and f"HINT: {near}" in err and len(err.splitlines()) == 2, err
