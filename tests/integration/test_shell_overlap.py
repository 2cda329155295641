"""``torchhpc shell``'s interactive step shares the allocation (``srun --overlap``), on the real dev cluster.

Since Slurm 20.11 a step holds its CPUs (and memory) exclusively: without
``--overlap`` an ``srun`` typed inside ``salloc ... srun --pty bash -i`` waits
until the shell ends. The test runs the argv that ``torchhpc shell`` renders,
with only what a test cannot have swapped out: no ``--pty`` (no terminal here)
and a command instead of ``bash -i``. The same command without ``--overlap``
is the control: its inner srun must still be waiting when ``timeout`` stops it,
which shows the test can fail.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from torchhpc.resolve import build_spec
from torchhpc.schedulers import get_scheduler

pytestmark = pytest.mark.cluster("slurm")


def shell_argv(command: str, overlap: bool = True) -> list[str]:
    spec = build_spec(
        {"scheduler": "slurm", "nodes": 1, "nproc_per_node": 1, "time": "00:05:00", "interactive_shell": True},
        ["bash"],
        {"HOME": "/nonexistent"},
    )
    argv = [str(a) for a in get_scheduler("slurm").shell_argv(spec)]
    assert argv[-2:] == ["bash", "-i"] and "--pty" in argv and "--overlap" in argv, argv
    argv = [a for a in argv[:-2] if a != "--pty" and (overlap or a != "--overlap")]
    return [*argv, "bash", "-c", command]


def run(cluster: Any, argv: list[str], timeout: float) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.monotonic()
    done = subprocess.run(argv, env=cluster.client_env(), cwd=REPO, capture_output=True, text=True, timeout=timeout)
    return done, time.monotonic() - start


def test_inner_srun_does_not_wait(slurm_cluster: Any) -> None:
    inner = 'start=$(date +%s); timeout 40 srun -n 1 hostname; echo "inner-rc=$? after $(( $(date +%s) - start )) s"'
    done, _ = run(slurm_cluster, shell_argv(inner), timeout=180)
    assert "inner-rc=0 after" in done.stdout, done.stdout + done.stderr
    seconds = int(done.stdout.split("inner-rc=0 after ")[1].split()[0])
    assert seconds < 30, done.stdout  # 0-1 s when idle; a waiting step would reach the 40 s timeout

    # Control: the same shell without --overlap, its inner srun still waiting after 15 s.
    done, _ = run(slurm_cluster, shell_argv("timeout 15 srun -n 1 hostname; echo inner-rc=$?", overlap=False), timeout=180)
    assert "inner-rc=124" in done.stdout, done.stdout + done.stderr


def test_torchhpc_run_inside_the_shell_finishes(slurm_cluster: Any, tmp_path: Path) -> None:
    """A ``torchhpc run --scheduler slurm ... --wait`` typed in the shell: submitted, run, waited for."""
    prog = tmp_path / "hello.py"
    prog.write_text("import os\nprint('hello from', os.environ.get('RANK'), flush=True)\n")
    cmd = (
        f"{sys.executable} -m torchhpc run --scheduler slurm --nodes 1 -n 1 --launcher srun --time 00:05:00 "
        f"--output-dir {tmp_path} --wait {prog}; echo run-rc=$?"
    )
    done, _ = run(slurm_cluster, shell_argv(cmd), timeout=400)
    assert "run-rc=0" in done.stdout, done.stdout + done.stderr
