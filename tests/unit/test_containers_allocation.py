"""Containers respect the allocation (issue 27.6): the GPUs Slurm gave, one enroot container per node,
one SIF build for a docker:// image.

Docker and Podman cannot get GPUs here (no engine with GPUs, no GPUs): the rendered command runs
for real in bash up to the runtime, which is a stub on PATH printing the argv it received, so the
test sees exactly what Docker/Podman would be given for the Slurm variables of a task. The
flags follow docs.docker.com (``--gpus '"device=1,2"'``) and the CDI names of
``nvidia-ctk cdi generate`` (``nvidia.com/gpu=N``). The batch-script parts are renders.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from torchhpc.cli.main import main
from torchhpc.containers import wrap
from torchhpc.core.shell import join
from torchhpc.core.spec import ContainerSpec


def run_with_stub(argv: list[str], runtime: str, env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    stub = tmp_path / runtime
    stub.write_text('#!/usr/bin/env python3\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n')
    stub.chmod(0o755)
    full = {"PATH": f"{tmp_path}:{os.environ['PATH']}", **env}
    return subprocess.run(argv, env=full, capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("runtime", ["docker", "podman"])
@pytest.mark.parametrize(
    ("env", "gpus"),
    [
        ({"SLURM_STEP_GPUS": "2,3", "SLURM_JOB_GPUS": "0,1,2,3", "CUDA_VISIBLE_DEVICES": "0,1"}, ["2", "3"]),
        ({"SLURM_JOB_GPUS": "1,3", "CUDA_VISIBLE_DEVICES": "0,1"}, ["1", "3"]),
        ({"CUDA_VISIBLE_DEVICES": "5"}, ["5"]),  # off Slurm: the visible set
    ],
)
def test_exactly_the_allocated_gpus(runtime: str, env: dict[str, str], gpus: list[str], tmp_path: Path) -> None:
    argv = wrap(ContainerSpec("img:1", runtime), ["python", "train.py"], gpus=4, pass_env=["SLURM_*", "RANK"])
    text = join(argv)
    assert "--gpus all" not in text and "gpu=all" not in text and "all" not in argv
    done = run_with_stub(argv, runtime, env, tmp_path)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    image = got.index("img:1")
    assert got[image:] == ["img:1", "python", "train.py"]
    if runtime == "docker":
        assert got[got.index("--gpus") + 1] == f'"device={",".join(gpus)}"' and got.index("--gpus") < image
        assert "--device" not in got
    else:
        devices = [got[i + 1] for i, a in enumerate(got[:image]) if a == "--device"]
        assert devices == [f"nvidia.com/gpu={g}" for g in gpus] and "--gpus" not in got
    assert "-e" in got or "SLURM_*" in got  # the environment flags survive the GPU prelude


@pytest.mark.parametrize("runtime", ["docker", "podman"])
def test_no_allocation_is_an_error_not_all_gpus(runtime: str, tmp_path: Path) -> None:
    argv = wrap(ContainerSpec("img:1", runtime), ["true"], gpus=1)
    done = run_with_stub(argv, runtime, {}, tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert "no GPU allocated" in done.stderr and len(done.stderr.splitlines()) == 1


def render(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["run", "--dry-run", "--scheduler", "slurm", "--nodes", "3", "--output-dir", "/scratch/o", *args]) == 0
    return capsys.readouterr().out


@pytest.mark.usefixtures("clean_user_env")
def test_enroot_create_once_per_node_before_the_launch(capsys: pytest.CaptureFixture[str]) -> None:
    out = render(capsys, "--runtime", "enroot", "--container", "nvcr.io/nvidia/pytorch:24.03-py3", "examples/pi.py")
    lines = out.splitlines()
    imports = [i for i, ln in enumerate(lines) if "enroot import" in ln]
    creates = [i for i, ln in enumerate(lines) if "enroot create" in ln]
    starts = [i for i, ln in enumerate(lines) if "enroot start" in ln]
    assert len(imports) == 1 and len(creates) == 1 and starts
    create = lines[creates[0] - 1].strip()  # srun's line, then the command (the image's name may be long)
    assert create.startswith('srun --ntasks="${SLURM_NNODES:-1}" --ntasks-per-node=1 ') and create.endswith("\\")
    assert "srun" not in lines[imports[0]]  # the squashfs is imported once, to the shared directory
    assert imports[0] < creates[0] < starts[0]


@pytest.mark.usefixtures("clean_user_env")
def test_docker_image_becomes_one_sif_before_the_launch(capsys: pytest.CaptureFixture[str]) -> None:
    out = render(capsys, "--runtime", "apptainer", "--container", "docker://nvcr.io/nvidia/pytorch:24.03-py3",
                 "examples/pi.py")
    builds = [ln for ln in out.splitlines() if "apptainer build" in ln]
    assert len(builds) == 2 and "srun" not in builds[0]  # once, in the batch script (the build, its error line)
    assert "docker://nvcr.io/nvidia/pytorch:24.03-py3" in builds[0]
    execs = [ln for ln in out.splitlines() if "apptainer exec" in ln or ("apptainer" in ln and "exec" in ln)]
    launch = out[out.index("apptainer exec"):]
    assert "docker://" not in launch.split("\n", 3)[0]  # the ranks start the cached SIF
    assert '"${TORCHHPC_SIF_CACHE:-$HOME/.cache/torchhpc/sif}"/nvcr.io_nvidia_pytorch_24.03-py3.sif' in launch
    assert out.index("apptainer build") < out.index("apptainer exec") and execs


def test_sif_build_runs_once_and_is_atomic(tmp_path: Path) -> None:
    """The set-up lines, run by bash with a stub apptainer: the second run finds the SIF and builds nothing."""
    from torchhpc.containers import setup_lines

    lines = "\n".join(setup_lines(ContainerSpec("docker://ubuntu:22.04", "apptainer")))
    log = tmp_path / "builds"
    stub = tmp_path / "apptainer"
    stub.write_text(f'#!/bin/sh\necho "$@" >> {log}\n[ "$1" = build ] && echo sif > "$2"\n')
    stub.chmod(0o755)
    env = {"PATH": f"{tmp_path}:{os.environ['PATH']}", "HOME": str(tmp_path), "TORCHHPC_SIF_CACHE": str(tmp_path / "cache")}
    for _ in range(2):
        done = subprocess.run(["bash", "-euc", lines], env=env, capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
    assert [ln.split()[0] for ln in log.read_text().splitlines()] == ["build"]
    assert (tmp_path / "cache" / "ubuntu_22.04.sif").read_text() == "sif\n"
    assert not list((tmp_path / "cache").glob("*.tmp"))
