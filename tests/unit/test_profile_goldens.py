"""Each built-in profile renders its seed's own example job; the render is a golden file.

The command for each profile is the seed's example said with torchhpc flags
(docs/profiles.md lists the seed's lines next to ours, with the reason for
every difference). The golden file is exactly what ``torchhpc run --dry-run``
prints; batch scripts are also linted (bash -n, shellcheck). Regenerate with
``TORCHHPC_REGEN_GOLDEN=1 pytest tests/unit/test_profile_goldens.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.golden_util import assert_golden, lint_script
from torchhpc.cli.main import main

REPO = Path(__file__).resolve().parents[2]

# profile -> (extra environment, the seed's example as torchhpc flags)
SEED_JOBS: dict[str, tuple[dict[str, str], list[str]]] = {
    # Seed 000, "Batched execution w/ Singularity" + the torchrun LAUNCHER block.
    "mn5": ({}, [
        "--profile", "mn5", "--name", "batched_execution", "--nodes", "2", "--time", "00:02:00",
        "--account", "bsc98", "--qos", "acc_bsccs", "--container", "MN5-NGC-PyTorch-24.03.sif",
        "--output-dir", "/scratch/demo", "examples/pi.py",
    ]),
    # Seed 002, mnist.slurm; the account from SBATCH_ACCOUNT as the seed sets it.
    "lumi": ({"SBATCH_ACCOUNT": "project_465001726"}, [
        "--profile", "lumi", "--name", "mnist", "--nodes", "4", "--time", "00:05:00",
        "--output-dir", "/scratch/demo", "examples/mnist_ddp.py",
    ]),
    # Seed 003, `srun --ntasks-per-node=1 --ntasks=2 torchrun --nnodes=2 --nproc_per_node=4 ...` (CC).
    "alliance-cc": ({}, [
        "--profile", "alliance-cc", "--account", "def-pi", "--nodes", "2", "--python", "venvhpc/bin/python",
        "--output-dir", "/scratch/demo", "examples/resnet_ddp.py", "--mode", "ddp",
    ]),
    # Seed 003, `mpirun -np 8 --hostfile $PBS_NODEFILE --oversubscribe ... python main.py` (Sockeye).
    "sockeye": ({}, [
        "--profile", "sockeye", "--account", "st-alice-1-gpu", "--nodes", "2", "--time", "01:00:00",
        "--python", "venvhpc/bin/python", "--output-dir", "/scratch/demo", "examples/resnet_ddp.py", "--mode", "ddp",
    ]),
    # Seed 004, RUNAI_run_app.sh + RCP_run_app.sh (2 pods, 20 processes each, no GPU).
    "rcp": ({}, [
        "--profile", "rcp", "--name", "my_first_distributed_app", "--image", "registry.example/basic:latest",
        "--nodes", "2", "--nproc-per-node", "20", "--opt", "pvc=mlo-scratch:/mloscratch",
        "--opt", "log_dir=/mloscratch/reports", "--env", "PATH_TO_ROOT_REPO=/mloscratch/getting-started",
        "examples/pi.py",
    ]),
}


@pytest.fixture(autouse=True)
def clean_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):
        if k.startswith(("TORCHHPC_", "SBATCH_", "SLURM_", "PBS_")) and k != "TORCHHPC_REGEN_GOLDEN":
            monkeypatch.delenv(k)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.chdir(REPO)


def test_every_builtin_has_a_seed_job() -> None:
    from torchhpc.profiles import BUILTIN

    assert set(SEED_JOBS) == set(BUILTIN)


@pytest.mark.parametrize("name", list(SEED_JOBS))
def test_seed_job_golden(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    env, argv = SEED_JOBS[name]
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert main(["run", "--dry-run", *argv]) == 0
    out, err = capsys.readouterr()
    if name == "lumi":  # seed 002's mnist_DDP.py has no torchhpc; ours imports it, the LUMI image lacks it
        assert err.startswith("Warning: examples/mnist_ddp.py imports torchhpc, which the image of profile 'lumi'")
        assert len(err.splitlines()) == 2 and "(submitting would stop here)" not in err
    else:
        assert err == ""  # no warning: the seed's job is complete
    assert_golden(out, f"profiles/{name}.txt")
    assert main(["run", "--dry-run", "--json", *argv]) == 0
    script = json.loads(capsys.readouterr().out)["script"]
    if script:
        lint_script(script, tmp_path)


def test_docs_table_covers_every_profile() -> None:
    text = (REPO / "docs" / "profiles.md").read_text()
    for name in SEED_JOBS:
        assert f"## {name}" in text, name
        assert f"tests/golden/profiles/{name}.txt" in text
