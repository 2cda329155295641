"""``bench sweep --dry-run`` (issue 26, item 5): every job it would submit, nothing written or submitted."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from torchhpc.cli.main import main


@pytest.mark.usefixtures("clean_user_env")
def test_sweep_dry_run_shows_every_job_and_touches_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "no-slurm-here"))  # an sbatch call would fail loudly
    before = sorted(os.listdir(tmp_path))
    rc = main(["bench", "sweep", "--scheduler", "slurm", "-N", "1,2,4", "-n", "4", "--out", "sweep/", "--dry-run",
               "--", "-b", "1M", "-e", "1G", "-f", "2"])
    out = capsys.readouterr().out
    assert rc == 0
    for i, n in enumerate((1, 2, 4), 1):
        assert f"# === sweep job {i} of 3: {n} node{'s' if n > 1 else ','}" in out
        assert f"#SBATCH --nodes={n}\n" in out
    assert out.count("sbatch --parsable") == 3 and out.count("-m torchhpc.bench") >= 3
    assert "-e 1G" in out or "'-e' '1G'" in out or "-e '1G'" in out
    assert sorted(os.listdir(tmp_path)) == before  # no sweep/ folder, no script
