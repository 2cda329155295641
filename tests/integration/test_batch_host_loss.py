"""The supervisor's own node: its loss ends the job as node-failure, allocation released (issue 70, item 1).

Under ``--spares 1 --max-restarts 2`` the in-allocation supervisor runs on the batch host. Failing that
node (``torchhpc devcluster fail``: link cut, every process SIGKILLed, as a power loss) used to leave the
job RUNNING on the other nodes with nothing running, holding them until someone ran scancel, while
``cancel`` answered "already finished" and ``diagnose`` blamed a user's cancel. Now the supervisor's
watch on another node (supervisor/sentinel.py) records the loss and cancels the job: squeue is empty
within 60 s and every reader says NODE_FAIL, 80; a watch whose own node dies first is started again on a
survivor. And ``cancel`` asks the scheduler, not only the job's end file. On a 4-node cluster of the
module's own: the test fails nodes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cli_run import torchhpc
from tests.integration.conftest import OWN_FIRST_JOB_ID, SlurmClient, cluster_of_its_own
from tests.integration.test_resilience import devcluster
from torchhpc.devcluster import ClusterState

pytestmark = pytest.mark.cluster("slurm")


@pytest.fixture(scope="module")
def own_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterState]:
    """This module's 4-node cluster, its job ids apart from test_resilience's own cluster's (a worker may run
    both modules: no ``slurm:N`` record of the run names two jobs)."""
    with cluster_of_its_own(tmp_path_factory, "bhost", 4, OWN_FIRST_JOB_ID + 60000) as state:
        yield state

SLEEPY = "import time\nprint('start', flush=True)\ntime.sleep(600)\n"


def _until(what: str, check: Any, timeout: float) -> float:
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < timeout, f"{what}: not within {timeout:.0f} s"
        time.sleep(0.5)
    return time.monotonic() - start


def _queued(slurm: SlurmClient, job: str) -> bool:
    return bool(slurm.run(["squeue", "-h", "-j", job, "-o", "%i"], check=False, timeout=30).stdout.strip())


def test_losing_the_batch_host_ends_the_job_as_node_failure_and_frees_its_nodes(
        own_cluster: Any, own_slurm: SlurmClient, tmp_path: Path) -> None:
    (tmp_path / "sleepy.py").write_text(SLEEPY)
    done = torchhpc(own_cluster, "run", "--scheduler", "slurm", "--nodes", "2", "--spares", "1", "--max-restarts", "2",
                    "--launcher", "srun", "--name", "bh", "--output-dir", str(tmp_path), "sleepy.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    job = done.stdout.split("Submitted slurm:")[1].split()[0]
    job_dir = tmp_path / f"bh-{job}"
    victims: list[str] = []
    try:
        _until("the supervisor's watch and the ranks started",
               lambda: "watching this node" in _text(job_dir / "slurm.out") and len(list(job_dir.glob("ranks/*"))) == 2, 120)
        # first the watch's own node (the spare, idle): the supervisor starts the watch again elsewhere
        spare = _text(job_dir / "slurm.out").split("watching this node, ")[1].split(" from ")[1].split(":")[0]
        victims.append(spare)
        devcluster(own_cluster, "fail", spare)
        _until("the watch started again", lambda: _text(job_dir / "slurm.out").count("watching this node") == 2, 60)
        victim = own_slurm.job(job)["BatchHost"]
        victims.append(victim)
        devcluster(own_cluster, "fail", victim)
        freed = _until("the job's nodes released (squeue empty)", lambda: not _queued(own_slurm, job), 60)
        handle = f"slurm:{job}"
        waited = torchhpc(own_cluster, "wait", handle, "--timeout", "60", cwd=tmp_path)
        st = json.loads(torchhpc(own_cluster, "status", handle, "--json", cwd=tmp_path).stdout)
        diag = json.loads(torchhpc(own_cluster, "diagnose", "--json", handle, cwd=tmp_path).stdout)
        ev = json.loads(torchhpc(own_cluster, "events", "--json", handle, cwd=tmp_path).stdout)
    finally:
        own_slurm.run(["scancel", job], check=False)
        for node in victims:
            devcluster(own_cluster, "revive", node)
    assert waited.returncode == 80, waited.stdout + waited.stderr
    assert (st["state"], st["exit_code"]) == ("NODE_FAIL", 80), st
    assert (diag["class"], diag["exit_code"]) == ("node-failure", 80), diag
    assert [e["text"] for e in ev["events"] if e["kind"] == "end"] == ["NODE_FAIL, exit 80"], ev
    last = json.loads((job_dir / "attempts.json").read_text())[-1]
    assert last["class"] == "node-failure" and f"the batch host {victim}" in last["detail"], last
    assert f"the batch host {victim}, where the supervisor ran, stopped answering" in _text(job_dir / "slurm.out")
    print(f"BATCH HOST LOSS: allocation released {freed:.1f} s after the fault")


def test_cancel_asks_the_scheduler_not_only_the_jobs_end_file(own_cluster: Any, own_slurm: SlurmClient,
                                                              tmp_path: Path) -> None:
    """A job whose end.json says it ended (its batch shell's trap ran, as on a dying batch host) while Slurm
    still runs it: ``cancel`` cancels it, never "had already finished"."""
    (tmp_path / "sleepy.py").write_text(SLEEPY)
    done = torchhpc(own_cluster, "run", "--scheduler", "slurm", "--name", "ce", "--output-dir", str(tmp_path),
                    "sleepy.py", cwd=tmp_path)
    job = done.stdout.split("Submitted slurm:")[1].split()[0]
    try:
        _until("the job runs", lambda: own_slurm.job(job).get("JobState") == "RUNNING", 60)
        (tmp_path / f"ce-{job}" / "end.json").write_text('{"state": "CANCELLED", "exit_code": 143, "time": 1}\n')
        cancelled = torchhpc(own_cluster, "cancel", f"slurm:{job}", cwd=tmp_path)
        assert cancelled.returncode == 0 and f"Cancelled slurm:{job}" in cancelled.stdout, cancelled.stdout
        _until("the job left the queue", lambda: not _queued(own_slurm, job), 60)
    finally:
        own_slurm.run(["scancel", job], check=False)


def _text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""
