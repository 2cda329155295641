"""The batch script reads top-down like a seed's (issue 25): the program is named early, no long lines before it.

Renders of examples/pi.py, 2 nodes x 2 ranks, under srun, mpirun and torchrun: the first
non-comment line that names the program is within the first 40 lines, and no line up to it is
longer than 160 characters; with a container and ``--profile lumi`` (modules, CPU masks,
network presets, the stop protocol), within the first 60.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.golden_util import lint_script
from torchhpc.cli.main import main

PROGRAM = "examples/pi.py"


def render(capsys: pytest.CaptureFixture[str], tmp_path: Path, *args: str) -> list[str]:
    rc = main(["run", "--scheduler", "slurm", "--nodes", "2", "--nproc-per-node", "2", "--output-dir", str(tmp_path),
               "--dry-run", *args, PROGRAM])
    out = capsys.readouterr().out
    assert rc == 0, out
    script = out.split(" ---\n", 1)[1].split("\n# --- ", 1)[0]  # up to the boot copy's files or the submit line
    assert script.startswith("#!/bin/bash")
    return script.splitlines()


def first_program_line(lines: list[str]) -> int:
    """1-based number of the first line, not a comment, that names the program."""
    return next(i for i, line in enumerate(lines, 1) if PROGRAM in line and not line.lstrip().startswith("#"))


@pytest.mark.parametrize("launcher", ["srun", "mpirun", "torchrun"])
def test_program_within_40_lines(launcher: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    lines = render(capsys, tmp_path, "--launcher", launcher)
    n = first_program_line(lines)
    assert n <= 40, "\n".join(lines[:n])
    assert max(len(line) for line in lines[:n]) <= 160, "\n".join(lines[:n])
    # no shell program in the script: the launch runs the boot directory's files, the shim told its launcher
    text = "\n".join(lines)
    assert f'bash "$TORCHHPC_BOOT_DIR/task.sh" {launcher}' in text and "_torchhpc_task_shim" not in text
    assert "SLURM_STEP_TASKS_PER_NODE" not in text and "TORCHELASTIC_RUN_ID" not in text


def test_srun_2x2_is_60_lines_of_160_characters_and_passes_shellcheck(capsys: pytest.CaptureFixture[str],
                                                                     tmp_path: Path) -> None:
    lines = render(capsys, tmp_path, "--launcher", "srun")
    assert len(lines) <= 60 and max(map(len, lines)) <= 160, "\n".join(lines)
    lint_script("\n".join(lines) + "\n", tmp_path)


README_IMAGE = "nvcr.io/nvidia/pytorch:24.03-py3"  # the README's own image: a registry, an org, a tag


@pytest.mark.parametrize("runtime", ["apptainer", "singularity", "enroot", "pyxis", "docker", "podman", "charliecloud"])
@pytest.mark.parametrize("image", ["reg.example/img:1", README_IMAGE])
def test_container_lines_within_160_characters(runtime: str, image: str, capsys: pytest.CaptureFixture[str],
                                               tmp_path: Path) -> None:
    """Every line the dry run prints (the script, the set-up that builds or creates the image once, the boot
    copy's header), with the README's image under every runtime (issue 69: the apptainer build line was 190)."""
    rc = main(["run", "--scheduler", "slurm", "--nodes", "2", "--nproc-per-node", "2", "--output-dir", str(tmp_path),
               "--launcher", "srun", "--runtime", runtime, "--container", image, "--gpus-per-node", "2", "--dry-run",
               PROGRAM])
    out = capsys.readouterr().out
    assert rc == 0, out
    shown = out.replace(str(tmp_path), "/o").splitlines()  # the output directory as a short one (the user's own)
    assert max(map(len, shown)) <= 160, max(shown, key=len)
    script = out.split(" ---\n", 1)[1].split("\n# --- ", 1)[0]
    lint_script(script + "\n", tmp_path)


# (lumi binds one GCD and CPU mask per task: torchrun's one task per node is refused there)
@pytest.mark.parametrize("launcher", ["srun", "mpirun"])
def test_program_within_60_lines_with_a_container_on_lumi(
    launcher: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    image = tmp_path / "pytorch.sif"
    image.write_bytes(b"")
    lines = render(capsys, tmp_path, "--launcher", launcher, "--profile", "lumi", "--account", "project_465000000",
                   "--time", "1:00:00", "--container", str(image))
    n = first_program_line(lines)
    assert n <= 60, "\n".join(lines[:n])
    assert max(len(line) for line in lines[:n]) <= 160, "\n".join(lines[:n])
    assert any("singularity exec" in line or "apptainer exec" in line for line in lines[:n])


@pytest.mark.parametrize("scheduler", ["slurm", "pbs"])
def test_no_script_line_looks_like_a_dry_run_file_header(scheduler: str, capsys: pytest.CaptureFixture[str],
                                                          tmp_path: Path) -> None:
    """`# --- PATH ---` opens each file of a dry run; a script line that starts the same way cut the script
    short for whoever splits the output (the compatibility matrix did: its jobs ran no rank and exited 0)."""
    rc = main(["run", "--scheduler", scheduler, "--nodes", "2", "--nproc-per-node", "2", "--output-dir", str(tmp_path),
               "--dry-run", PROGRAM])
    out = capsys.readouterr().out
    assert rc == 0, out
    headers = [line for line in out.splitlines() if line.startswith("# --- ")]
    assert all(line.endswith(" ---") for line in headers), headers
    assert len(headers) == 2 and headers[-1] == "# --- submit with ---", headers
