"""The shell programs of the boot directory (src/torchhpc/boot/*.sh): shipped, linted, and missed in one line.

``write.sh`` (launchers/boot.py ``WRITER``) is the boot writer's template: packaged and linted as POSIX sh, but
it makes a copy's sitecustomize.py and travels with none.

Batch scripts run them by path (``bash "$TORCHHPC_BOOT_DIR/rank.sh" ...``) instead of carrying their text;
a copy of the boot directory (a container, ``--python``) holds them all. What each one does is tested where
it is used: test_task_shim.py, test_gpu_per_task.py, test_logs.py, test_containers_wrap.py.
"""

from __future__ import annotations

import fnmatch
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import missing
from torchhpc.core.spec import ContainerSpec, Entrypoint, JobSpec
from torchhpc.launchers.boot import BOOT_DIR, SHELL_PROGRAMS, WRITER, boot_files, boot_shell
from torchhpc.schedulers.batch.script import boot_lines, job_boot

ROOT = Path(__file__).resolve().parents[2]


def test_every_shipped_program_is_listed_and_packaged() -> None:
    on_disk = sorted(p.name for p in Path(BOOT_DIR).glob("*.sh"))
    assert on_disk == sorted([*SHELL_PROGRAMS, WRITER])
    import tomllib  # 3.11+: the test tier's Python

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["torchhpc"]
    for name in on_disk:
        assert any(fnmatch.fnmatch(f"boot/{name}", pat) for pat in data), f"boot/{name} is not package data"


@pytest.mark.parametrize("name", SHELL_PROGRAMS)
def test_shellcheck_passes_on_each_program(name: str) -> None:
    path = Path(BOOT_DIR, name)
    assert path.read_text().startswith("#!/bin/bash\n")
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
    if shutil.which("shellcheck") is None:
        missing("shellcheck is not installed (.ci/run installs it)")
    r = subprocess.run(["shellcheck", "-s", "bash", "-S", "style", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_boot_writer_is_posix_sh_and_travels_with_no_copy() -> None:
    path = Path(BOOT_DIR, WRITER)
    assert WRITER not in SHELL_PROGRAMS and WRITER not in dict(boot_files())
    program = boot_shell()
    assert "@SITECUSTOMIZE_PY@" not in program and "@BOOT_HASH@" not in program
    assert not program.startswith("#") and "shellcheck" not in program  # the template's comments stay in the file
    assert subprocess.run(["sh", "-n", str(path)], capture_output=True).returncode == 0
    assert subprocess.run(["sh", "-n"], input=program, text=True, capture_output=True).returncode == 0
    if shutil.which("shellcheck") is None:
        missing("shellcheck is not installed (.ci/run installs it)")
    r = subprocess.run(["shellcheck", "-s", "sh", "-S", "style", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_copy_of_the_boot_directory_holds_every_program(tmp_path: Path) -> None:
    spec = JobSpec(entrypoint=Entrypoint.parse(["t.py"]), scheduler="slurm", output_dir=str(tmp_path),
                   container=ContainerSpec("img.sif", "apptainer"))
    where, files = job_boot(spec)
    assert {Path(p).name for p, _ in files} == {"sitecustomize.py", *SHELL_PROGRAMS}
    assert all(Path(p).parent == Path(where) for p, _ in files) and dict(boot_files())["task.sh"] in dict(files).values()


def test_a_script_without_its_boot_directory_stops_in_one_line(tmp_path: Path) -> None:
    spec = JobSpec(entrypoint=Entrypoint.parse(["t.py"]), scheduler="slurm", output_dir=str(tmp_path),
                   container=ContainerSpec("img.sif", "apptainer"))
    script = "\n".join(["set -euo pipefail", *boot_lines(spec), "echo launched"]) + "\n"
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "task.sh" in done.stderr and "install torchhpc" in done.stderr
