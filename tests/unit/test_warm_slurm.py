"""Warm starts of a Slurm job without the supervisor (boot/standby.sh, slurm/launch.py's ``standby_lines``).

Which rendered jobs start a standby on each node, and that the sourced file speaks the same names as the
supervisor's standbys and the same "off" words as core/units.py. The cluster run of it is
tests/integration/test_warm_slurm.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from torchhpc.boot import warm
from torchhpc.core.launcher_kind import LauncherKind
from torchhpc.core.spec import ContainerSpec, Entrypoint, JobSpec
from torchhpc.core.units import OFF_WORDS
from torchhpc.launchers.boot import BOOT_DIR
from torchhpc.schedulers.allocation import STANDBY_STEP
from torchhpc.schedulers.slurm.launch import standby_lines
from torchhpc.supervisor.standby import SWITCH, Standby

STANDBY_SH = Path(BOOT_DIR, "standby.sh")
TORCH_PROGRAM = "import os\n\ndef main():\n    import torch\n"


@pytest.fixture
def program(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(TORCH_PROGRAM)
    (tmp_path / "plain.py").write_text("import os\nprint(os.getpid())\n")
    return tmp_path


def _lines(script: str, python: str | None = None, launcher: str = "srun", container: str = "", **kw: object) -> list[str]:
    spec = JobSpec(entrypoint=Entrypoint.parse([script], python=python), scheduler="slurm", name="t", nodes=2,
                   launcher=LauncherKind(launcher), container=ContainerSpec(container) if container else None,
                   **kw)  # type: ignore[arg-type]
    return standby_lines(spec)


def test_the_standby_file_speaks_the_supervisors_names_and_the_off_words() -> None:
    text = STANDBY_SH.read_text()
    case = re.search(r"^  ([^)]*)\) ;;$", text, re.M)
    assert case and {w.strip() for w in case.group(1).split("|")} == set(OFF_WORDS)
    assert f"--job-name={STANDBY_STEP} " in text and f"${{{SWITCH}:-on}}" in text
    assert f'{warm.WARM_VAR}="torchhpc-warm-$SLURM_JOB_ID" {warm.PYTHON_VAR}="$1"' in text
    assert 'f"torchhpc-warm-{job}"' in Path(sys.modules[Standby.__module__].__file__ or "").read_text()


@pytest.mark.parametrize(("why", "kw"), [
    ("srun, 2 ranks a node", {"nproc_per_node": 2, "launcher": "srun"}),
    ("mpirun, 2 ranks a node", {"nproc_per_node": 2, "launcher": "mpirun"}),
    ("torchrun, 2 workers a node and the agent", {"nproc_per_node": 2, "launcher": "torchrun"}),
])
def test_a_node_with_two_ranks_of_a_torch_program_starts_a_standby(program: Path, why: str, kw: dict[str, object]) -> None:
    lines = _lines("train.py", **kw)  # type: ignore[arg-type]
    assert len(lines) == 1 and lines[0].startswith(f'. "$TORCHHPC_BOOT_DIR/standby.sh" {sys.executable}  # '), why
    assert "import " not in "\n".join(lines)  # a script carries no Python


@pytest.mark.parametrize(("why", "kw"), [
    ("one rank a node", {"script": "train.py", "nproc_per_node": 1, "launcher": "srun"}),
    ("torchrun, one worker a node", {"script": "train.py", "nproc_per_node": 1, "launcher": "torchrun"}),
    ("no torch in the program", {"script": "plain.py", "nproc_per_node": 2, "launcher": "srun"}),
    ("a program that is not there", {"script": "gone.py", "nproc_per_node": 2, "launcher": "srun"}),
    ("the supervisor starts its own", {"script": "train.py", "nproc_per_node": 2, "launcher": "srun", "max_restarts": 2}),
    ("another Python", {"script": "train.py", "nproc_per_node": 2, "launcher": "srun", "python": "/opt/py/bin/python3"}),
    ("a container", {"script": "train.py", "nproc_per_node": 2, "launcher": "srun", "container": "img.sif"}),
])
def test_no_standby_where_it_cannot_pay(program: Path, why: str, kw: dict[str, object]) -> None:
    assert _lines(**kw) == [], why  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["off", "OFF", "0", "no", "none", "False"])
def test_off_starts_nothing_and_names_no_standby(tmp_path: Path, value: str) -> None:
    """The file sourced as main() does, with ``srun`` a stub that records being called."""
    stub = tmp_path / "srun"
    stub.write_text(f"#!/bin/sh\necho called >> {tmp_path / 'calls'}\n")
    stub.chmod(0o755)
    script = f'. {STANDBY_SH} /py; wait; echo "standby=${{TORCHHPC_WARM_STANDBY:-}} pid=${{_torchhpc_standby:-}}"'
    env = {"PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}", "SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "2",
           "TORCHHPC_BOOT_DIR": BOOT_DIR}
    off = subprocess.run(["bash", "-c", script], env={**env, SWITCH: value}, capture_output=True, text=True)
    assert off.stdout.strip() == "standby= pid=" and not (tmp_path / "calls").exists()
    on = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True)
    assert on.stdout.startswith("standby=torchhpc-warm-7 pid=") and (tmp_path / "calls").read_text() == "called\n"
