"""``torchhpc bench sweep`` on the real Slurm dev cluster: 1, 2 and 3 nodes, small sizes.

Real sbatch jobs, real srun ranks on namespace nodes talking gloo over veth;
the report is built from the JSON the jobs wrote.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.cluster("slurm"), pytest.mark.slow]


def test_sweep_one_two_three_nodes_writes_table_and_png(slurm_cluster: Any, tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    r = subprocess.run(
        [sys.executable, "-m", "torchhpc", "bench", "sweep", "--scheduler", "slurm", "--nodes", "1,2,3",
         "--nproc-per-node", "1", "--launcher", "srun", "--time", "10", "--out", str(out), "--timeout", "300",
         "--", "-b", "1K", "-e", "256K", "-f", "16", "-n", "3", "-w", "1"],
        env=slurm_cluster.client_env(), cwd=tmp_path, capture_output=True, text=True, timeout=1200,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    for n in (1, 2, 3):
        data = json.loads((out / f"bench-{n}n.json").read_text())
        # the job really spanned n distinct nodes, one rank each, and every check passed
        assert (data["nodes"], data["world_size"], data["wrong"]) == (n, n, 0)
        assert len({rk["host"] for rk in data["ranks"]}) == n
    md = (out / "report.md").read_text()
    table = [line.split("|") for line in md.splitlines() if line.startswith("| ") and "K |" in line]
    seeds_rows = [[c.strip() for c in row[1:4]] for row in table if len(row) > 9]
    assert seeds_rows == [["1", "1", "256K"], ["2", "2", "256K"], ["3", "3", "256K"]]
    assert "| 1K |" in md and "| 16K |" in md
    png = (out / "busbw.png").read_bytes()
    assert png[:4] == b"\x89PNG" and len(png) > 10_000
    # the report rebuilds from the saved JSON alone
    r2 = subprocess.run([sys.executable, "-m", "torchhpc", "bench", "report", str(out), "-o", str(tmp_path / "again")],
                        capture_output=True, text=True, timeout=120)
    assert r2.returncode == 0, r2.stderr
    assert (tmp_path / "again" / "report.md").read_text().split("![")[0] == md.split("![")[0]


def test_sweep_in_a_container(slurm_cluster: Any, tmp_path: Path) -> None:
    """Every rank inside a Charliecloud image (Debian's python + torch, no torchhpc installed:
    the source comes in through a bind and PYTHONPATH, as a site would bind a checkout)."""
    from tests.conftest import REPO, container_image_env

    image_env = container_image_env()
    env = {**slurm_cluster.client_env(), **image_env}
    env.setdefault("USER", "root")  # ch-run refuses to start without $USER
    out = tmp_path / "sweep"
    r = subprocess.run(
        [sys.executable, "-m", "torchhpc", "bench", "sweep", "--scheduler", "slurm", "--nodes", "1,2",
         "--nproc-per-node", "1", "--launcher", "srun", "--runtime", "charliecloud",
         "--container", image_env["TORCHHPC_TEST_CH_IMAGE"], "--bind", f"{tmp_path}:{tmp_path}",
         "--env", f"PYTHONPATH={REPO / 'src'}", "--out", str(out), "--timeout", "300",
         "--", "-b", "4K", "-e", "64K", "-f", "4", "-n", "3", "-w", "1"],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=900,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    scripts = sorted(out.glob("bench-all_reduce-2n-*/job.sbatch"))  # the job's own directory, <name>-<id>/
    assert len(scripts) == 1, sorted(p.name for p in out.iterdir())
    assert "ch-run" in scripts[0].read_text()
    data = json.loads((out / "bench-2n.json").read_text())
    assert (data["nodes"], data["world_size"], data["wrong"]) == (2, 2, 0)
    assert (out / "report.md").exists() and (out / "busbw.png").exists()
