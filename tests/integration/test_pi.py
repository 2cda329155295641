"""examples/pi.py runs unchanged under torchhpc run, torchrun, mpirun, srun-direct and alone.

Every run counts the ranks that reported (one ``rank R/W on HOST`` line each)
and checks rank 0's estimate. ``--no-torchhpc`` makes pi.py find its ranks
itself, as on a node where torchhpc is not installed.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import PYTHON, REPO, missing

PI = str(REPO / "examples" / "pi.py")
ESTIMATE = re.compile(r"pi ≈ ([0-9.]+) error ([0-9.eE+-]+) ranks (\d+) steps (\d+) time ([0-9.]+) s")


def ranks_reported(text: str, world: int) -> set[int]:
    return {int(r) for r in re.findall(rf"rank (\d+)/{world} on \S+: partial", text)}


def check(text: str, world: int, steps: int, max_error: float) -> None:
    assert ranks_reported(text, world) == set(range(world)), text
    m = ESTIMATE.search(text)
    assert m, text
    pi, err = float(m.group(1)), float(m.group(2))
    assert int(m.group(3)) == world and int(m.group(4)) == steps
    assert abs(pi - math.pi) < max_error and err < max_error
    assert len(ESTIMATE.findall(text)) == 1  # only rank 0 prints the estimate


def run(argv: list[str], env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    cp = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    return cp


def test_readme_first_command_four_ranks_default_steps() -> None:
    """`torchhpc run -n 4 examples/pi.py`: error below 1e-10 from 4 processes, output per rank."""
    cp = run([PYTHON, "-m", "torchhpc", "run", "-n", "4", "examples/pi.py"])
    check(cp.stdout, 4, 100_000_000, 1e-10)
    for r in range(4):
        assert re.search(rf"^\[rank{r}\]: rank {r}/4 on ", cp.stdout, re.M), cp.stdout


def test_without_torchhpc_under_torchhpc_run() -> None:
    cp = run([PYTHON, "-m", "torchhpc", "run", "-n", "2", "examples/pi.py", "--steps", "100000", "--no-torchhpc"])
    check(cp.stdout, 2, 100_000, 1e-10)
    assert "via env" in cp.stdout


def test_torchrun() -> None:
    torchrun = Path(PYTHON).with_name("torchrun")
    if not torchrun.exists():
        missing("torchrun is not beside this interpreter")
    cp = run([str(torchrun), "--standalone", "--nproc_per_node", "2", PI, "--steps", "100000"])
    check(cp.stdout, 2, 100_000, 1e-10)


def test_mpirun_on_a_node_without_torchhpc(tmp_path: Path) -> None:
    """OpenMPI's mpirun + python, as on PBS sites (seed 003): ranks from OMPI_COMM_WORLD_*.

    A ``torchhpc`` package that fails to import shadows the real one, as on a
    node where it is not installed.
    """
    if shutil.which("mpirun") is None:
        missing("no mpirun on this machine")
    shadow = tmp_path / "torchhpc"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("raise ImportError('torchhpc is not installed on this node')\n")
    env = dict(
        os.environ,
        PYTHONPATH=str(tmp_path),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(_free_port()),
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        OMPI_MCA_btl="self,tcp",
        OMPI_MCA_pml="ob1",
    )
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(k, None)
    cp = run(
        ["mpirun", "-np", "2", "--oversubscribe", "-x", "MASTER_ADDR", "-x", "MASTER_PORT", "-x", "PATH",
         "-x", "PYTHONPATH", PYTHON, PI, "--steps", "100000"],
        env=env,
    )
    check(cp.stdout, 2, 100_000, 1e-10)
    assert cp.stdout.count("via env") == 2


def test_single_process() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "SLURM_PROCID")}
    cp = run([PYTHON, PI, "--steps", "50000", "--no-torchhpc"], env=env)
    check(cp.stdout, 1, 50_000, 1e-10)


def test_steps_must_be_positive() -> None:
    cp = subprocess.run([PYTHON, PI, "--steps", "0"], capture_output=True, text=True, timeout=120)
    assert cp.returncode == 2 and "--steps=0" in cp.stderr


def test_first_host_of_slurm_nodelists() -> None:
    sys.path.insert(0, str(REPO / "examples"))
    try:
        import pi
    finally:
        sys.path.pop(0)
    assert pi.first_host("gpu[07-09,12],login1") == "gpu07"
    assert pi.first_host("node1,node2") == "node1"
    assert pi.first_host("a1-[1-3]-b") == "a1-1"
    assert pi.first_host("solo") == "solo"
    env = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_STEP_NODELIST": "n[2-3]", "SLURM_JOB_ID": "12345"}
    assert pi.ranks_from_env(env) == (3, 4, "n2", str(10000 + 12345 % 20000))
    # MPI wins over the SLURM_* an mpirun inside an allocation inherits
    env.update(OMPI_COMM_WORLD_RANK="1", OMPI_COMM_WORLD_SIZE="2", MASTER_ADDR="h", MASTER_PORT="1")
    assert pi.ranks_from_env(env) == (1, 2, "h", "1")
    env.update(RANK="0", WORLD_SIZE="8")
    assert pi.ranks_from_env(env) == (0, 8, "h", "1")


@pytest.mark.cluster("slurm")
@pytest.mark.parametrize("torchhpc", [True, False], ids=["torchhpc.dist", "no-torchhpc"])
def test_srun_direct_two_nodes(slurm: Any, tmp_path: Path, torchhpc: bool) -> None:
    """Plain `srun python pi.py` on the dev cluster: no shim, no torchrun; ranks from SLURM_*."""
    flags = "" if torchhpc else " --no-torchhpc"
    script = tmp_path / "pi.sbatch"
    script.write_text(
        "#!/bin/bash\n"
        f"cd {REPO}\n"
        f"srun -N2 --ntasks-per-node=1 {PYTHON} {PI} --steps 200000{flags}\n"
    )
    out = tmp_path / "out.txt"
    job = slurm.sbatch(["-N2", "-o", str(out), str(script)])
    info = slurm.wait(job, timeout=300)
    text = out.read_text() if out.exists() else ""
    assert info.get("JobState") == "COMPLETED", text
    check(text, 2, 200_000, 1e-10)
    assert len(set(re.findall(r"rank \d+/2 on (\S+):", text))) == 2  # really two nodes


def _free_port() -> int:
    from torchhpc.schedulers.local.ranks import free_port

    return free_port()
