"""The supervisor's own node: its loss ends the job as node-failure, allocation released (issue 70, item 1).

Under ``--spares 1 --max-restarts 2`` the in-allocation supervisor runs on the batch host. Failing that
node (``torchhpc devcluster fail``: link cut, every process SIGKILLed, as a power loss) used to leave the
job RUNNING on the other nodes with nothing running, holding them until someone ran scancel, while
``cancel`` answered "already finished" and ``diagnose`` blamed a user's cancel. Now the supervisor's
watch on another node (supervisor/sentinel.py) records the loss and cancels the job: squeue is empty
within 60 s and every reader says NODE_FAIL, 80; a watch whose own node dies first is started again on a
survivor. A node lost with no spare left reads node-failure too (diagnose said "unknown"), at once and
once only sacct knows the job. And ``cancel`` asks the scheduler, not only the job's end file. On a
cluster of the module's own: the test fails nodes.
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
from torchhpc.core.hostlist import expand
from torchhpc.devcluster import ClusterState

pytestmark = pytest.mark.cluster("slurm")


@pytest.fixture(scope="module")
def own_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterState]:
    """This module's 6-node cluster with accounting and a short MinJobAge (30 s), its job ids apart from
    test_resilience's own cluster's (a worker may run both modules: no ``slurm:N`` record names two jobs)."""
    with cluster_of_its_own(tmp_path_factory, "bhost", 6, OWN_FIRST_JOB_ID + 60000, accounting=True,
                            min_job_age=30) as state:
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


def _submit(cluster: Any, cwd: Path, name: str, *args: str) -> str:
    done = torchhpc(cluster, "run", "--scheduler", "slurm", "--nodes", "2", "--launcher", "srun", "--name", name,
                    "--opt", "exclusive=1", "--output-dir", str(cwd), *args, "sleepy.py", cwd=cwd)  # nodes apart
    assert done.returncode == 0, done.stderr
    return done.stdout.split("Submitted slurm:")[1].split()[0]


def _readings(cluster: Any, cwd: Path, job: str) -> dict[str, Any]:
    handle = f"slurm:{job}"
    st = json.loads(torchhpc(cluster, "status", handle, "--json", cwd=cwd).stdout)
    diag = json.loads(torchhpc(cluster, "diagnose", "--json", handle, cwd=cwd).stdout)
    ev = json.loads(torchhpc(cluster, "events", "--json", handle, cwd=cwd).stdout)
    return {"wait": torchhpc(cluster, "wait", handle, "--timeout", "60", cwd=cwd).returncode,
            "status": (st["state"], st["exit_code"]), "diagnose": (diag["class"], diag["exit_code"], diag["summary"]),
            "events": [e["text"] for e in ev["events"] if e["kind"] == "end"]}


def _node_failure(r: dict[str, Any], said: str) -> bool:
    return (r["wait"] == 80 and r["status"] == ("NODE_FAIL", 80) and r["diagnose"][:2] == ("node-failure", 80)
            and said in r["diagnose"][2] and r["events"] == ["NODE_FAIL, exit 80"])


def test_a_node_loss_ends_as_node_failure_at_once_and_after_accounting(
        own_cluster: Any, own_slurm: SlurmClient, tmp_path: Path) -> None:
    """Two endings side by side: the batch host lost under ``--spares 1 --max-restarts 2`` (its watch's own node
    lost first, so the watch moves), and a node lost with no spare left (``--max-restarts 1``, issue 70 item 15:
    diagnose said "unknown"). Each is node-failure, 80, in every reader, right after the end and again once
    only sacct knows the job (MinJobAge: this module's cluster forgets a job 30 s after its end)."""
    (tmp_path / "sleepy.py").write_text(SLEEPY)
    host_job = _submit(own_cluster, tmp_path, "bh", "--spares", "1", "--max-restarts", "2")
    _until("the batch-host job runs", lambda: own_slurm.job(host_job).get("JobState") == "RUNNING", 60)
    spare_job = _submit(own_cluster, tmp_path, "ns", "--max-restarts", "1")
    host_dir, spare_dir = tmp_path / f"bh-{host_job}", tmp_path / f"ns-{spare_job}"
    victims: list[str] = []
    try:
        for d in (host_dir, spare_dir):
            _until(f"{d.name}: the supervisor's watch and the ranks started",
                   lambda d=d: "watching this node" in _text(d / "slurm.out") and len(list(d.glob("ranks/*"))) == 2, 120)
        # first the watch's own node (the spare, idle): the supervisor starts the watch again elsewhere
        spare = _text(host_dir / "slurm.out").split("watching this node, ")[1].split(" from ")[1].split(":")[0]
        victims.append(spare)
        devcluster(own_cluster, "fail", spare)
        _until("the watch started again", lambda: _text(host_dir / "slurm.out").count("watching this node") == 2, 60)
        batch_host = own_slurm.job(host_job)["BatchHost"]
        other = next(h for h in expand(own_slurm.job(spare_job)["NodeList"]) if h != own_slurm.job(spare_job)["BatchHost"])
        victims += [batch_host, other]
        devcluster(own_cluster, "fail", batch_host)
        devcluster(own_cluster, "fail", other)
        freed = _until("the batch-host job's nodes released (squeue empty)", lambda: not _queued(own_slurm, host_job), 60)
        _until("the no-spare job ended", lambda: not _queued(own_slurm, spare_job), 60)
        at_once = {j: _readings(own_cluster, tmp_path, j) for j in (host_job, spare_job)}
        _until("the controller forgets both jobs", lambda: all(
            own_slurm.run(["scontrol", "show", "job", j], check=False, timeout=30).returncode for j in (host_job, spare_job)),
            150)
        later = {j: _readings(own_cluster, tmp_path, j) for j in (host_job, spare_job)}
    finally:
        own_slurm.run(["scancel", host_job, spare_job], check=False)
        for node in victims:
            devcluster(own_cluster, "revive", node)
    said = {host_job: f"the batch host {batch_host}, where the supervisor ran, stopped answering",
            spare_job: f"{other} lost"}
    wrong = {j: (at_once[j], later[j]) for j in said if not (_node_failure(at_once[j], said[j])
                                                               and _node_failure(later[j], said[j]))}
    assert not wrong, wrong
    last = json.loads((host_dir / "attempts.json").read_text())[-1]
    assert last["class"] == "node-failure" and said[host_job] in last["detail"], last
    assert said[host_job] in _text(host_dir / "slurm.out")
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
