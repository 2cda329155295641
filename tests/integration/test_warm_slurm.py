"""Warm starts of a Slurm job without the supervisor, on the real dev cluster (boot/standby.sh).

A 2-node x 2-rank job of each launcher whose program imports torch: every rank finds torch already imported
when its first line runs (it was forked from its node's standby), the job ends COMPLETED with the ranks' exit,
and no standby step or process outlives it. With ``TORCHHPC_WARM=off`` every rank imports torch itself.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.cli_run import torchhpc

pytestmark = pytest.mark.cluster("slurm")

PROGRAM = """\
import json, os, sys
warm = "torch" in sys.modules  # before this program imports anything of its own
import torch
print("WARM " + json.dumps({"rank": int(os.environ["RANK"]), "warm": warm, "node": os.environ.get("SLURMD_NODENAME")}),
      flush=True)
"""


def _warm_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(m) for m in re.findall(r"WARM (\{.*\})", text)]


def _standbys_left(cluster: Any, job_id: str) -> str:
    """The job's steps the controller still lists (a standby step that outlived the job would be one)."""
    return subprocess.run(["squeue", "-h", "-s", "-j", job_id, "-o", "%i %j"], env=cluster.client_env(),
                          capture_output=True, text=True, timeout=30).stdout.strip()


@pytest.mark.parametrize("launcher", ["srun", "torchrun", "mpirun"])
def test_each_node_imports_torch_once_and_its_standby_ends_with_the_job(slurm_cluster: Any, launcher: str,
                                                                       tmp_path: Path) -> None:
    (tmp_path / "prog.py").write_text(PROGRAM)
    r = torchhpc(slurm_cluster, "run", "--scheduler", "slurm", "--nodes", "2", "--nproc-per-node", "2",
                 "--launcher", launcher, "--output-dir", str(tmp_path), "--name", f"warm-{launcher}",
                 "prog.py", "--wait", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    ranks = _warm_lines(r.stdout)
    assert sorted(x["rank"] for x in ranks) == [0, 1, 2, 3], r.stdout
    assert all(x["warm"] for x in ranks), r.stdout
    assert len({x["node"] for x in ranks}) == 2, r.stdout
    job_id = re.search(r"Submitted slurm:(\d+)", r.stdout).group(1)  # type: ignore[union-attr]
    deadline = time.monotonic() + 30
    while (left := _standbys_left(slurm_cluster, job_id)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left == ""
    end = json.loads(next(tmp_path.glob(f"warm-{launcher}-*/end.json")).read_text())
    assert (end["state"], end["exit_code"]) == ("COMPLETED", 0)


def test_off_in_the_jobs_environment_starts_every_rank_cold(slurm_cluster: Any, tmp_path: Path) -> None:
    (tmp_path / "prog.py").write_text(PROGRAM)
    r = torchhpc(slurm_cluster, "run", "--scheduler", "slurm", "--nodes", "2", "--nproc-per-node", "2",
                 "--launcher", "srun", "--output-dir", str(tmp_path), "--name", "cold", "-e", "TORCHHPC_WARM=off",
                 "prog.py", "--wait", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    ranks = _warm_lines(r.stdout)
    assert sorted(x["rank"] for x in ranks) == [0, 1, 2, 3] and not any(x["warm"] for x in ranks), r.stdout
