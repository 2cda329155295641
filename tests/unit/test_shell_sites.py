"""``torchhpc shell`` per site (issue 27): --overlap everywhere, the seeds' module loads, mn5 without --time.

Renders only (``--dry-run``); the dev-cluster proof that --overlap lets an inner srun start is
tests/integration/test_shell_overlap.py.
"""

from __future__ import annotations

import shlex

import pytest

from torchhpc.cli.main import main


def shell(capsys: pytest.CaptureFixture[str], *args: str) -> list[str]:
    assert main(["shell", "--dry-run", *args]) == 0
    return shlex.split(capsys.readouterr().out)


@pytest.mark.usefixtures("clean_user_env")
@pytest.mark.parametrize("profile", ["mn5", "lumi", "alliance-cc"])
def test_every_slurm_shell_overlaps(profile: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = shell(capsys, "--profile", profile, "--account", "p", "--qos", "q", "--time", "1:00:00", "--no-container")
    srun = argv.index("srun")
    assert argv[srun + 1] == "--overlap" and "--pty" in argv[srun:]


@pytest.mark.usefixtures("clean_user_env")
def test_mn5_shell_follows_the_seed(capsys: pytest.CaptureFixture[str]) -> None:
    # Seed 000: `salloc -q acc_debug --account bsc98 --gres=gpu:2 --cpus-per-task 40` (no --time),
    # and `module load singularity` before singularity.
    argv = shell(capsys, "--profile", "mn5", "--account", "bsc98", "--qos", "acc_debug", "--gpus-per-node", "2",
                 "--container", "img.sif")
    assert not any(a.startswith("--time") for a in argv)
    assert "--account=bsc98" in argv and "--qos=acc_debug" in argv and "--cpus-per-task=40" in argv
    inner = argv[-1]
    assert argv[-3:-1] == ["bash", "-c"]
    assert inner.index("module load singularity") < inner.index("exec singularity exec")
    assert inner.endswith("bash -i")


@pytest.mark.usefixtures("clean_user_env")
def test_mn5_batch_still_requires_time(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--dry-run", "--profile", "mn5", "--account", "bsc98", "--qos", "acc_debug",
                 "--container", "img.sif", "examples/pi.py"]) != 0
    assert "requires --time" in capsys.readouterr().err


@pytest.mark.usefixtures("clean_user_env")
def test_lumi_shell_loads_modules_before_sif_expands(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SBATCH_ACCOUNT", "project_465001726")
    argv = shell(capsys, "--profile", "lumi", "--time", "00:15:00")
    inner = argv[-1]
    loads = ["module load LUMI/24.03", "module load PyTorch/2.3.1-rocm-6.0.3-python-3.12-singularity-20240923"]
    assert inner.index(loads[0]) < inner.index(loads[1]) < inner.index('"$SIF"')
