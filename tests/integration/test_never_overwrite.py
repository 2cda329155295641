"""torchhpc never writes to a path a user may own (issue 26, item 1), on the real Slurm dev cluster.

A hand-written ``pi.sbatch``, ``pi.pbs`` and an old ``pi-sweep-x/`` sit beside ``pi.py``;
``run --scheduler slurm``, ``sweep`` and a submit that sbatch rejects (a partition that does
not exist: sbatch exits 1) all leave every one of them byte-identical, and the failed submit
leaves nothing new. The PBS half (a fake qsub) is tests/unit/test_never_overwrite.py.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.cli_run import torchhpc
from tests.unit.test_never_overwrite import snapshot, user_dir

pytestmark = pytest.mark.cluster("slurm")


def test_run_sweep_and_failed_submit_keep_the_users_files(slurm_cluster: Any, tmp_path: Path) -> None:
    d = user_dir(tmp_path)
    before = snapshot(d)

    r = torchhpc(slurm_cluster, "run", "--scheduler", "slurm", "--nodes", "2", "--nproc-per-node", "1",
                 "--launcher", "srun", "pi.py", "--steps", "100000", "--wait", cwd=d)
    assert r.returncode == 0, r.stdout + r.stderr
    job = re.search(r"Submitted slurm:(\d+)", r.stdout).group(1)  # type: ignore[union-attr]
    assert (d / f"pi-{job}" / "job.sbatch").read_text().startswith("#!/bin/bash")
    assert "rank 1/2" in r.stdout

    s = torchhpc(slurm_cluster, "sweep", "--scheduler", "slurm", "--grid", "steps=1000,2000", "pi.py",
                 "--steps", "{steps}", "--wait", cwd=d)
    assert s.returncode == 0, s.stdout + s.stderr
    sweeps = sorted(p.name for p in d.glob("pi-sweep-*") if p.name != "pi-sweep-x")
    assert len(sweeps) == 1 and (d / sweeps[0] / "sweep.json").exists()

    after = snapshot(d)
    assert {k: v for k, v in after.items() if k in before} == before, "a pre-existing file changed"
    assert not [k for k in after if Path(k).name.startswith(".pi.")], "a private script was left behind"

    # refused before sbatch (exit 2: no such partition here), and sbatch rejecting what torchhpc cannot check
    # (a license nobody has; exit 1): nothing new anywhere in the directory either way
    mid = snapshot(d)
    f = torchhpc(slurm_cluster, "run", "--scheduler", "slurm", "--partition", "no_such_partition", "pi.py", cwd=d)
    assert f.returncode == 2 and "partition" in f.stderr.lower(), f.stdout + f.stderr
    assert snapshot(d) == mid
    f = torchhpc(slurm_cluster, "run", "--scheduler", "slurm", "--opt", "sbatch_extra=--licenses=nosuchlicense:1",
                 "pi.py", cwd=d)
    assert f.returncode == 1 and "licen" in f.stderr.lower(), f.stdout + f.stderr
    assert snapshot(d) == mid
