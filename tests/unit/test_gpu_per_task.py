"""One GPU (and, under mpirun, one CPU mask) per task, as seed 002's LUMI runscript does it.

The task shim runs for real in bash with the variables srun / OpenMPI give a task
(no GPU here: the shim only sets ROCR_VISIBLE_DEVICES, which the test reads back);
the CPU mask is applied for real by taskset and read back from /proc/self/status.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.conftest import missing
from torchhpc.launchers.boot import TASK_SH
from torchhpc.profiles import BUILTIN
from torchhpc.profiles.builtin import LUMI_CPU_MASKS

SRUN = {"SLURM_PROCID": "11", "SLURM_LOCALID": "3", "SLURM_NODEID": "1", "SLURM_STEP_NUM_TASKS": "16",
        "SLURM_STEP_TASKS_PER_NODE": "8(x2)"}
MPI = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
       "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}


def run_shim(launcher: str, env: dict[str, str], cmd: str, shim: str = TASK_SH) -> str:
    full = {"PATH": os.environ["PATH"], **env}
    done = subprocess.run(["bash", shim, launcher, "bash", "-c", cmd],
                          env=full, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_lumi_profile_asks_for_it() -> None:
    env = dict(BUILTIN["lumi"].env)
    assert env["TORCHHPC_GPU_PER_TASK"] == "ROCR_VISIBLE_DEVICES"
    assert env["TORCHHPC_CPU_MASKS"] == LUMI_CPU_MASKS and BUILTIN["lumi"].cpu_bind == "mask_cpu:" + LUMI_CPU_MASKS


def test_srun_task_gets_the_gcd_of_its_local_id() -> None:
    shim = TASK_SH
    env = {**SRUN, "TORCHHPC_GPU_PER_TASK": "ROCR_VISIBLE_DEVICES"}
    assert run_shim("srun", env, 'echo "$ROCR_VISIBLE_DEVICES"', shim) == "3"
    # The node's list already set (a job with 4 of the 8 GCDs): the task takes its own entry of it.
    env = {**env, "SLURM_LOCALID": "2", "ROCR_VISIBLE_DEVICES": "4,5,6,7"}
    assert run_shim("srun", env, 'echo "$ROCR_VISIBLE_DEVICES"', shim) == "6"


def test_without_the_variable_nothing_is_hidden() -> None:
    assert run_shim("srun", SRUN, 'echo "${ROCR_VISIBLE_DEVICES-unset}"') == "unset"


def test_torchrun_workers_are_left_alone() -> None:
    env = {"TORCHELASTIC_RUN_ID": "1", "RANK": "5", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "8",
           "TORCHHPC_GPU_PER_TASK": "ROCR_VISIBLE_DEVICES"}
    assert run_shim("torchrun", env, 'echo "${ROCR_VISIBLE_DEVICES-unset}"') == "unset"


def test_mpirun_task_binds_its_own_mask() -> None:
    if shutil.which("taskset") is None:
        missing("taskset (util-linux) is not installed")
    if len(os.sched_getaffinity(0)) < 2 or not {0, 1} <= os.sched_getaffinity(0):
        missing("needs CPUs 0 and 1")
    env = {**MPI, "TORCHHPC_GPU_PER_TASK": "ROCR_VISIBLE_DEVICES", "TORCHHPC_CPU_MASKS": "0x1,0x2"}
    out = run_shim("mpirun", env, 'echo "$ROCR_VISIBLE_DEVICES"; grep Cpus_allowed_list /proc/self/status')
    gpu, cpus = out.splitlines()
    assert gpu == "1" and cpus.split()[-1] == "1"  # local rank 1: mask 0x2 is CPU 1


@pytest.mark.usefixtures("clean_user_env")
def test_torchrun_on_lumi_is_refused_naming_srun(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from torchhpc.cli.main import main

    monkeypatch.setenv("SBATCH_ACCOUNT", "project_465001726")
    assert main(["run", "--dry-run", "--profile", "lumi", "--time", "00:05:00", "--launcher", "torchrun", "examples/pi.py"]) != 0
    err = capsys.readouterr().err
    assert "CPU masks" in err and "HINT: use --launcher srun" in err
    for launcher in ("srun", "mpirun"):
        assert main(["run", "--dry-run", "--profile", "lumi", "--time", "00:05:00", "--launcher", launcher, "examples/pi.py"]) == 0
    out = capsys.readouterr().out
    assert "export TORCHHPC_GPU_PER_TASK=ROCR_VISIBLE_DEVICES" in out


@pytest.mark.usefixtures("clean_user_env")
def test_import_warning_only_for_the_profile_image(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from torchhpc.cli.main import main

    monkeypatch.setenv("SBATCH_ACCOUNT", "project_465001726")
    base = ["run", "--dry-run", "--profile", "lumi", "--time", "00:05:00"]
    assert main([*base, "examples/mnist_ddp.py"]) == 0  # a warning, not a refusal
    assert "imports torchhpc" in capsys.readouterr().err
    assert main([*base, "examples/pi.py"]) == 0  # its import sits in a fallback
    assert capsys.readouterr().err == ""
    assert main([*base, "--container", "mine.sif", "examples/mnist_ddp.py"]) == 0  # the user's own image
    assert capsys.readouterr().err == ""
