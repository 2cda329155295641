"""What could never run is refused at submit on the real cluster, and ``wait`` stops on one that slipped in.

The shared dev cluster (4 nodes of 12 CPUs, one partition ``debug``, accounting): each request below
was accepted by sbatch before (issue 70) and waited forever, or failed inside torchhpc's held submit
with its internal sbatch line and a false "is this a Slurm login node?" (exit 1). Now: exit 2, one
``Error:`` line naming the value, a ``HINT:`` naming what the cluster has. Nothing reaches the queue.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.cli_run import torchhpc

pytestmark = pytest.mark.cluster("slurm")

REFUSED = {
    "nodes": (["--nodes", "8"], "--nodes 8: partition debug has 4 nodes", "node1, node2, node3, node4"),
    "memory": (["--mem", "100G"], "--mem 100G: partition debug's nodes have at most", "--mem "),
    "cpus": (["--nproc-per-node", "16", "--launcher", "srun"], "16 tasks x 1 CPUs per node", "at most 12 CPUs"),
    "exclude": (["--nodes", "2", "--opt", "exclude=node[1-3]"], "once --exclude node[1-3]", "nodes there: node4"),
    "dependency": (["--after-ok", "99999"], "Slurm knows no job 99999", "torchhpc list -s slurm"),
    "partition": (["--partition", "gpu"], "this cluster has no partition gpu", "partitions here: debug"),
    "account": (["--account", "nosuch"], "account nosuch: not an account of yours", "accounts here: root"),
    "command": (["--", "nosuchcmd"], "the command 'nosuchcmd' is not on PATH here", "give its full path"),
}


def test_what_could_never_run_is_refused_at_submit(slurm_cluster: Any, tmp_path: Path) -> None:
    (tmp_path / "ok.py").write_text("print('ok')\n")
    wrong = {}
    for case, (args, error, hint) in REFUSED.items():
        done = torchhpc(slurm_cluster, "run", "--scheduler", "slurm", "--name", case, "--output-dir", str(tmp_path),
                        *args, *([] if "--" in args else ["ok.py"]), cwd=tmp_path)
        lines = done.stderr.strip().splitlines()
        if not (done.returncode == 2 and len(lines) == 2 and lines[0].startswith("Error: ") and error in lines[0]
                and lines[1].startswith("HINT: ") and hint in lines[1] and "Submitted" not in done.stdout):
            wrong[case] = (done.returncode, done.stdout, done.stderr)
    assert not wrong, wrong


def test_wait_stops_on_a_job_that_can_never_run(slurm_cluster: Any, slurm: Any, tmp_path: Path) -> None:
    """A request only sbatch sees (an extra raw flag) slips past the checks: ``wait`` says it can never run
    and stops (exit 2), instead of a line a second forever."""
    (tmp_path / "ok.py").write_text("print('ok')\n")
    done = torchhpc(slurm_cluster, "run", "--scheduler", "slurm", "--name", "never", "--output-dir", str(tmp_path),
                    "--opt", "sbatch_extra=--nodes=8", "ok.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    job = done.stdout.split("Submitted slurm:")[1].split()[0]
    try:
        waited = torchhpc(slurm_cluster, "wait", f"slurm:{job}", "--timeout", "60", cwd=tmp_path, timeout=90)
    finally:
        slurm.run(["scancel", job], check=False)
    err = waited.stderr.strip().splitlines()
    assert waited.returncode == 2, waited.stderr
    assert err[-2].startswith(f"Error: job slurm:{job}: it can never run as it stands"), waited.stderr
    assert err[-1].startswith("HINT: ") and "torchhpc cancel" in err[-1], waited.stderr
