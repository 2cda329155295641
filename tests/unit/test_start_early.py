"""A command started early (core/proc.py ``start_early``) answers the first run() of the same argv, once, and
only where that run would have started it the same way; ``run -s slurm`` starts sinfo early (slurm/site.py).
Real processes: a shell that records each start in a file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from torchhpc.core import proc
from torchhpc.core.proc import Runner, start_early
from torchhpc.schedulers import ask_early
from torchhpc.schedulers.slurm import site


@pytest.fixture(autouse=True)
def nothing_early() -> None:
    for p, _env in proc._EARLY.values():
        p.kill()
        p.wait()
    proc._EARLY.clear()


def _counting(tmp_path: Path) -> tuple[list[str], Path]:
    starts = tmp_path / "starts"
    return ["sh", "-c", f'echo x >> {starts}; echo "answer $THPC_WORD"'], starts


def test_the_early_start_answers_the_run_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("THPC_WORD", "early")
    argv, starts = _counting(tmp_path)
    start_early(argv)
    start_early(argv)  # started once
    assert Runner().run(argv).stdout == "answer early\n"
    assert Runner().run(argv).stdout == "answer early\n"  # the second run starts its own
    assert starts.read_text().count("x") == 2


def test_another_environment_or_a_cwd_asks_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    argv, _ = _counting(tmp_path)
    monkeypatch.setenv("THPC_WORD", "early")
    start_early(argv)
    assert Runner(env={**os.environ, "THPC_WORD": "late"}).run(argv).stdout == "answer late\n"
    start_early(argv)
    assert Runner().run(argv, cwd=str(tmp_path)).stdout == "answer early\n"
    assert not proc._EARLY


def test_a_failure_of_the_early_start_is_the_runs_failure(tmp_path: Path) -> None:
    start_early(["sh", "-c", "echo no >&2; exit 3"])
    with pytest.raises(proc.CommandError) as e:
        Runner().run(["sh", "-c", "echo no >&2; exit 3"])
    assert e.value.returncode == 3 and "no" in e.value.stderr


@pytest.mark.parametrize(("words", "started"), [
    (["-s", "slurm", "pi.py"], True),
    (["--scheduler=slurm", "-N", "2", "pi.py"], True),
    (["-sslurm", "pi.py"], True),
    (["--scheduler", "slurm", "--dry-run", "pi.py"], False),
    (["-s", "pbs", "pi.py"], False),
    (["pi.py", "--scheduler"], False),
    (["--remote", "login", "-s", "slurm", "pi.py"], False),
])
def test_run_starts_sinfo_early_only_for_a_real_slurm_submission(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, words: list[str], started: bool
) -> None:
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))
    monkeypatch.delenv("TORCHHPC_REMOTE", raising=False)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    (tmp_path / "sinfo").write_text("#!/bin/sh\necho 'node1|debug*|4|1000'\n")
    (tmp_path / "sinfo").chmod(0o755)
    ask_early(words)
    assert (site.SINFO_ARGV in proc._EARLY) == started
    if started:
        assert Runner().run(list(site.SINFO_ARGV)).stdout == "node1|debug*|4|1000\n"


def test_without_a_site_slurm_nothing_starts_early(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURM_CONF", raising=False)
    monkeypatch.setattr(site, "SITE_CONFS", ())
    ask_early(["-s", "slurm", "pi.py"])  # a dev cluster's environment is known only later
    assert not proc._EARLY
