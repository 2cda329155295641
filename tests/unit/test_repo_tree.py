"""What must never be committed: the output of a job run inside the checkout."""

from __future__ import annotations

import re
import shutil
import subprocess

from tests.conftest import REPO, missing


def test_no_rank_output_is_tracked() -> None:
    """Every job writes <output-dir>/<name>-<id>/ranks/rank-N@host.log; one run from the repository root
    once left such a tree (q7ph/train-42/ranks/) in a commit. A file under any ranks/ directory is job output."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        missing("git or the repository's .git is not here")
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout.decode()
    tracked = [f for f in files.split("\0") if f]
    assert tracked, "git ls-files listed nothing"
    stray = [f for f in tracked if "ranks" in f.split("/")[:-1]]
    assert not stray, f"job output is tracked (git rm it): {stray}"


# What a scheduler writes into the directory a job was submitted from: sbatch's slurm-N.out (and
# slurm-A_T.out for an array task), PBS's NAME.oN / NAME.eN, a job directory NAME-ID/.
JOB_OUTPUT = re.compile(r"^(slurm-\d+(_\d+)?\.out|.+\.[oe]\d+|.+-\d+/)$")


def job_output_in_root(names: list[str]) -> list[str]:
    return sorted(n for n in names if JOB_OUTPUT.match(n))


def test_no_job_output_sits_in_the_root() -> None:
    """A test that submits from the checkout without ``--output`` leaves slurm-N.out in the root
    (eight were once committed, from test_pending.py's sbatch helper): tracked or just left there,
    no file in the repository root is a job's output."""
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True).stdout.split()
    roots = {p.split("/")[0] + ("/" if "/" in p else "") for p in tracked}
    on_disk = {p.name + ("/" if p.is_dir() else "") for p in REPO.iterdir() if not p.name.startswith(".")}
    stray = job_output_in_root(sorted(roots | on_disk))
    assert not stray, f"job output in the repository root (delete it; submit with --output or cwd=tmp_path): {stray}"


def test_the_root_check_knows_job_output() -> None:
    assert job_output_in_root(["slurm-12.out", "slurm-3_1.out", "train.o42", "pi-17/", "src/", "README.md"]) == [
        "pi-17/", "slurm-12.out", "slurm-3_1.out", "train.o42"]


def test_ruff_lints_the_dist_package() -> None:
    """ruff's default exclude holds ``dist``, which silently skipped src/torchhpc/dist/ (10 modules):
    pyproject.toml names its own list, and ``dist`` must not come back into it."""
    import tomllib

    ruff = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["ruff"]
    assert "exclude" in ruff and "extend-exclude" not in ruff, "without its own exclude, ruff skips dist/"
    assert not {"dist", "dist/", "**/dist"} & set(ruff["exclude"]), ruff["exclude"]
