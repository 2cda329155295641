"""``torchhpc events`` of a node-loss job on the real dev cluster: its timeline matches sacct's clock.

The scenario is test_resilience.py's node loss with a spare (2 x 2 srun, ``--spares 1``, a real
``devcluster fail`` of a working node after step 100). Then ``events --json`` must give sacct's
own Submit, Eligible, Start and End to the second (asked here with a separate ``sacct`` call, in
the format sacct prints), every interval between them must be sacct's, each attempt must sit inside
[Start, End], and the account must sum to the wall time within 1 s.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import SlurmClient
from tests.integration.test_nothing_lost import log_of, submit, wait_until
from tests.integration.test_resilience import FAULT_AFTER, TRAIN, attempts, devcluster, rank0_step

pytestmark = pytest.mark.cluster("slurm")


def _sacct_clock(slurm: SlurmClient, job: str) -> dict[str, float]:
    """sacct's own four times of ``job`` (local time, as sacct prints them), polled until End is known."""
    deadline = time.monotonic() + 60
    while True:
        row = slurm.run(["sacct", "-n", "-X", "-P", "-j", job, "-o", "Submit,Eligible,Start,End"],
                        check=False).stdout.strip().splitlines()
        if row and "Unknown" not in row[-1]:  # a resized job (it lost a node) has a row per size: the last ends it
            break
        assert time.monotonic() < deadline, f"sacct has no End for job {job}: {row}"
        time.sleep(1)
    names = ("submit", "eligible", "start", "end")
    fields = row[0].split("|")[:3] + row[-1].split("|")[3:]
    return {k: time.mktime(time.strptime(v, "%Y-%m-%dT%H:%M:%S")) for k, v in zip(names, fields)}


@pytest.mark.exclusive  # fails a node of the shared dev cluster
def test_events_of_a_node_loss_job_match_sacct_to_the_second(
    slurm_cluster: Any, slurm: SlurmClient, tmp_path: Path
) -> None:
    name = "evloss"
    job = submit(slurm_cluster, tmp_path, name,
                 ["-N", "2", "--spares", "1", "--nproc-per-node", "2", "--max-restarts", "1"],
                 [*TRAIN, "--sleep", "0.1"], launcher="srun")
    hosts = slurm.run(["scontrol", "show", "hostnames", wait_until(
        lambda: slurm.job(job).get("NodeList") if slurm.job(job).get("JobState") == "RUNNING" else None,
        120, "the job to start")]).stdout.split()
    victim = hosts[1]  # hosts[0] is the batch host
    wait_until(lambda: rank0_step(tmp_path, name, job) > FAULT_AFTER, 240, f"step {FAULT_AFTER}", every=0.1)
    try:
        devcluster(slurm_cluster, "fail", victim)
        info = slurm.wait(job, timeout=300)
    finally:
        devcluster(slurm_cluster, "revive", victim)
    assert info["JobState"] == "COMPLETED", log_of(tmp_path, name, job)[-3000:]
    want = _sacct_clock(slurm, job)
    done = subprocess.run([sys.executable, "-m", "torchhpc", "events", f"slurm:{job}", "--json"],
                          env=slurm_cluster.client_env(), cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    first: dict[str, float] = {}
    for e in out["events"]:
        first.setdefault(e["kind"], e["time"])
    got = {k: first[k] for k in ("submit", "eligible", "start", "end")}
    assert got == want, (got, want)  # each of sacct's times to the second, hence every interval between them
    for x, y in (("submit", "eligible"), ("eligible", "start"), ("start", "end"), ("submit", "end")):
        assert got[y] - got[x] == want[y] - want[x]
    acct = out["account"]
    assert acct["wall_s"] == want["end"] - want["submit"] and acct["queue_s"] == want["start"] - want["submit"]
    total = acct["queue_s"] + acct["startup_s"] + acct["productive_s"] + acct["lost_s"] + acct["shutdown_s"]
    assert abs(total - acct["wall_s"]) <= 1.0, acct
    assert acct["incidents"] == 1 and acct["incident_list"][0]["class"] == "node-failure", acct
    tries = attempts(tmp_path, name, job)
    assert [a["class"] for a in tries] == ["node-failure", None], tries
    for a in tries:  # the supervisor's clock and sacct's agree: every attempt inside the allocation
        assert want["start"] - 1 <= a["started"] and a["ended"] <= want["end"] + 1, (a, want)
    kinds = [e["kind"] for e in out["events"]]
    assert kinds.count("attempt") == 2 and "fault" in kinds and "restart" in kinds and "exclude" in kinds, kinds
