"""Completion offers names after the flags that take them (issue 26, item 5), through a real bash:
the generated script is sourced, COMP_WORDS/COMP_CWORD set as bash's completion sets them, and
_torchhpc's COMPREPLY read back (compgen does the matching)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import missing
from torchhpc.cli.main import main
from torchhpc.core.launcher_kind import LAUNCHERS
from torchhpc.core.spec import RUNTIMES
from torchhpc.profiles import list_profiles
from torchhpc.schedulers import scheduler_names


@pytest.fixture
def complete(tmp_path: Path, capsys: pytest.CaptureFixture[str]):  # type: ignore[no-untyped-def]
    if shutil.which("bash") is None:
        missing("bash is not installed")
    assert main(["completion", "bash"]) == 0
    script = tmp_path / "torchhpc.bash"
    script.write_text(capsys.readouterr().out)

    def run(*words: str) -> list[str]:
        quoted = " ".join(f"'{w}'" for w in words)
        probe = (f'source {script}; COMP_WORDS=({quoted}); COMP_CWORD={len(words) - 1}; _torchhpc; '
                 'printf "%s\\n" "${COMPREPLY[@]}"')
        done = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=True, timeout=30)
        return [w for w in done.stdout.split("\n") if w]

    return run


def test_names_after_their_flags(complete) -> None:  # type: ignore[no-untyped-def]
    assert set(complete("torchhpc", "run", "--profile", "")) == set(list_profiles()) >= {"lumi", "mn5"}
    assert complete("torchhpc", "run", "--profile", "lu") == ["lumi"]
    assert set(complete("torchhpc", "run", "--scheduler", "")) == set(scheduler_names())
    assert complete("torchhpc", "run", "-s", "sl") == ["slurm"]
    assert complete("torchhpc", "status", "--scheduler", "p") == ["pbs"]
    assert set(complete("torchhpc", "run", "--launcher", "")) == set(LAUNCHERS)
    assert set(complete("torchhpc", "run", "-N", "2", "--runtime", "")) == set(RUNTIMES)
    assert complete("torchhpc", "bench", "sweep", "--launcher", "m") == ["mpirun"]
    assert complete("torchhpc", "container", "convert", "--runtime", "") == ["apptainer", "singularity"]  # its own


def test_no_names_where_the_flag_takes_none(complete) -> None:  # type: ignore[no-untyped-def]
    assert "--profile" in complete("torchhpc", "run", "--pro")
    assert "slurm" not in complete("torchhpc", "bench", "nodes", "-s", "")  # -s is --size there
    assert complete("torchhpc", "bench", "nodes", "--scheduler", "sl") == ["slurm"]
    assert not set(complete("torchhpc", "run", "--nodes", "")) & set(scheduler_names())
