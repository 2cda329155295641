"""Job arrays on the real dev cluster (Slurm with accounting), and the PBS array body.

Slurm part: nothing faked -- sbatch --array, srun, sacct. PBS part: no PBS server can be
installed here, so (as in test_pbs_body.py) a Slurm allocation plays the PBS job and a
wrapper gives the rendered script what a PBS MOM gives an array task (PBS_NODEFILE,
PBS_JOBID ``N[I].server``, PBS_ARRAY_INDEX); the script body itself runs for real.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.cli_run import torchhpc
from tests.conftest import PYTHON, REPO
from tests.fakes import FakeRunner
from torchhpc.core.spec import Entrypoint, JobSpec
from torchhpc.schedulers.pbs.pbs import PBSScheduler

pytestmark = pytest.mark.cluster("slurm")

TASK = """import json, os, sys, time
i = int(os.environ["TORCHHPC_ARRAY_INDEX"])
print(f"task {i} of {os.environ['TORCHHPC_ARRAY_COUNT']} port {os.environ['MASTER_PORT']} "
      f"host {os.uname().nodename} argv {json.dumps(sys.argv[1:])}", flush=True)
time.sleep(float(os.environ.get("HOLD", "0")))
print("RESULT " + json.dumps({"index": i}), flush=True)
sys.exit(3 if i == 2 else 0)
"""
ODD = "a'b {index}&x $HOME"


@pytest.mark.parametrize("launcher", ["srun", "mpirun", "torchrun"])
def test_array_on_one_node_ports_argv_and_failed_task(slurm_cluster: Any, tmp_path: Path, launcher: str) -> None:
    """4 tasks, 2 at a time, all on node1: distinct ports; {index} in exact argv; task 2 exits 3 ->
    wait exits non-zero naming task 2, the other tasks COMPLETED (sacct). Each task's ranks write
    their own files in <output-dir>/<name>-ARRAY_TASK/ranks/ (made by the task's batch shell), so
    `logs slurm:ARRAY_TASK --rank 0` gives the rank's lines under every launcher."""
    script = tmp_path / "task.py"
    script.write_text(TASK)
    sub = torchhpc(slurm_cluster, "run", "--scheduler", "slurm", "--launcher", launcher, "--array", "0-3%2",
                   "--opt", "nodelist=node1", "-e", "HOLD=3", "--output-dir", str(tmp_path), "--python", PYTHON,
                   "--", str(script), "--seed", "{index}", ODD, cwd=tmp_path)
    assert sub.returncode == 0, sub.stderr
    job = re.search(r"Submitted slurm:(\d+)", sub.stdout).group(1)  # type: ignore[union-attr]
    waited = torchhpc(slurm_cluster, "wait", f"slurm:{job}", "--timeout", "200", cwd=tmp_path)
    assert waited.returncode != 0
    # the task's own 3 under every launcher (torchrun's agent ends 1: the end trap reads its root cause)
    assert "failed: 2 (exit 3)" in waited.stderr and "3 COMPLETED, 1 FAILED" in waited.stderr, waited.stderr
    ports, hosts = {}, set()
    for i in range(4):
        log = torchhpc(slurm_cluster, "logs", f"slurm:{job}_{i}", "--rank", "0", cwd=tmp_path).stdout
        m = re.search(r"task (\d) of 4 port (\d+) host (\S+) argv (.*)", log)
        assert m and int(m.group(1)) == i, log
        assert log.splitlines()[0].startswith("task "), log  # the rank's own line, whole, no prefix
        ports[i] = int(m.group(2))
        hosts.add(m.group(3))
        assert json.loads(m.group(4)) == ["--seed", str(i), ODD.replace("{index}", str(i))]
        assert (tmp_path / f"task-{job}_{i}" / "ranks" / "rank-0@node1.log").exists()
    print(launcher, "ports per task on", hosts, ports)
    assert hosts == {"node1"}
    if launcher != "torchrun":  # torchrun's workers get the agent's own store port, not the rendezvous port
        assert len(set(ports.values())) == 4, ports
    whole = torchhpc(slurm_cluster, "logs", f"slurm:{job}", cwd=tmp_path)
    assert whole.returncode == 2 and f"slurm:{job}_0" in whole.stderr, whole.stderr  # an array: name a task
    one = torchhpc(slurm_cluster, "status", "--json", f"slurm:{job}", cwd=tmp_path)
    tasks = {t["job_id"]: t["state"] for t in json.loads(one.stdout)["tasks"]}
    assert tasks == {f"{job}_0": "COMPLETED", f"{job}_1": "COMPLETED", f"{job}_2": "FAILED", f"{job}_3": "COMPLETED"}
    assert "exit=3" in torchhpc(slurm_cluster, "status", f"slurm:{job}_2", cwd=tmp_path).stdout


WRAPPER = """#!/bin/bash
# Stand-in for PBS: what a PBS Pro MOM gives array task 5.
set -euo pipefail
export PBS_NODEFILE={nodefile}
scontrol show hostnames "$SLURM_JOB_NODELIST" > "$PBS_NODEFILE"
export PBS_JOBID="${{SLURM_JOB_ID}}[5].pbsserver01" PBS_ARRAY_INDEX=5 PBS_O_WORKDIR={workdir} USER="${{USER:-root}}"
unset MASTER_ADDR MASTER_PORT
exec bash {script}
"""


def test_pbs_array_body_with_synthesised_index(slurm: Any, tmp_path: Path) -> None:
    script = tmp_path / "task.py"
    script.write_text(TASK)
    spec = JobSpec(Entrypoint.parse([str(script), "--seed", "{index}", ODD], python=PYTHON), nodes=1,
                   launcher="mpirun", scheduler="pbs", array="0-6:1%2", output_dir=str(tmp_path), name="arr")
    text = PBSScheduler(runner=FakeRunner()).render(spec).script or ""
    assert "#PBS -J 0-6%2" in text
    (tmp_path / "job.pbs").write_text(text)
    wrapper = tmp_path / "wrapper.sh"
    wrapper.write_text(WRAPPER.format(nodefile=tmp_path / "nodefile", workdir=REPO, script=tmp_path / "job.pbs"))
    out = tmp_path / "out.log"
    job = slurm.sbatch(["-N1", f"--output={out}", "--time=5", str(wrapper)], cwd=str(tmp_path))
    info = slurm.wait(job, timeout=200)
    log = out.read_text(errors="replace") if out.exists() else ""
    assert info.get("JobState") == "COMPLETED", f"{info}\n{log}"
    m = re.search(r"task 5 of 7 port (\d+) host \S+ argv (\[[^\]]*\])", log)
    assert m, log
    assert json.loads(m.group(2)) == ["--seed", "5", ODD.replace("{index}", "5")]
    assert int(m.group(1)) == 10000 + (int(job) * 10000 + 5) % 20000


def test_sweep_mnist_grid_two_at_a_time_report(slurm_cluster: Any, tmp_path: Path) -> None:
    """The issue's acceptance: a 2x2 grid of 2-node MNIST DDP trainings as one array, at most 2
    tasks at once; `sweep report` has 4 rows, each with the accuracy from its task's RESULT line."""
    out = tmp_path / "sw"
    sub = torchhpc(slurm_cluster, "sweep", "--scheduler", "slurm", "--grid", "lr=0.5,1.0", "--grid", "seed=1,2",
                   "--nodes", "2", "--nproc-per-node", "1", "--launcher", "srun", "--array-parallelism", "2",
                   "--output-dir", str(out), "--python", PYTHON, "--", str(REPO / "examples" / "mnist_ddp.py"),
                   "--epochs", "1", "--lr", "{lr}", "--seed", "{seed}", "--train-size", "256", "--test-size", "128",
                   cwd=tmp_path)
    assert sub.returncode == 0, sub.stderr
    job = re.search(r"Submitted slurm:(\d+)", sub.stdout).group(1)  # type: ignore[union-attr]
    most = 0
    for _ in range(600):
        st = json.loads(torchhpc(slurm_cluster, "status", "--json", f"slurm:{job}", cwd=tmp_path).stdout)
        most = max(most, sum(t["state"] == "RUNNING" for t in st.get("tasks", [])))
        if st["state"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
            break
        __import__("time").sleep(1)
    assert st["state"] == "COMPLETED", st
    assert most <= 2, most
    rep = torchhpc(slurm_cluster, "sweep", "report", str(out), cwd=tmp_path)
    assert rep.returncode == 0, rep.stderr
    rows = json.loads(torchhpc(slurm_cluster, "sweep", "status", "--json", str(out), cwd=tmp_path).stdout)
    assert [(r["lr"], r["seed"], r["state"]) for r in rows] == [
        ("0.5", "1", "COMPLETED"), ("0.5", "2", "COMPLETED"), ("1.0", "1", "COMPLETED"), ("1.0", "2", "COMPLETED")]
    assert all(0.0 <= r["result.accuracy"] <= 1.0 and r["result.world_size"] == 2 for r in rows), rows
    assert (out / "report.md").read_text().count("| COMPLETED |") == 4 and (out / "report.csv").exists()


def test_requeue_of_one_task_resumes_it_alone(slurm_cluster: Any, slurm: Any, tmp_path: Path) -> None:
    """`scontrol requeue ARRAY_1` (what Slurm does on preemption with requeue) sends task 1 alone
    back to the queue; it resumes from its own checkpoint ({index} in --ckpt); task 0 is untouched."""
    train = str(REPO / "tests" / "integration" / "scripts" / "ckpt_train.py")
    sub = torchhpc(slurm_cluster, "run", "--scheduler", "slurm", "--launcher", "torchrun", "--requeue",
                   "--array", "0-1", "--name", "rq", "--output-dir", str(tmp_path), "--python", PYTHON, "--", train,
                   "--ckpt", str(tmp_path / "ckpt-{index}"), "--out", str(tmp_path / "final-{index}.pt"),
                   "--steps", "30", "--sleep", "0.5", "--sleep-first-attempt-only", "--ckpt-every", "5", cwd=tmp_path)
    assert sub.returncode == 0, sub.stderr
    job = re.search(r"Submitted slurm:(\d+)", sub.stdout).group(1)  # type: ignore[union-attr]
    log1 = tmp_path / f"rq-{job}_1" / "ranks" / "rank-0@node1.log"  # task 1's rank 0 (its own directory)

    def text_of(task: int) -> str:
        return "".join(p.read_text() for p in sorted((tmp_path / f"rq-{job}_{task}" / "ranks").glob("rank-0@*.log")))

    deadline = __import__("time").monotonic() + 240
    while not re.search(r"\bstep (?:[5-9]|[12]\d) restart=0", text_of(1)):
        assert __import__("time").monotonic() < deadline, text_of(1) or f"no log in {log1.parent}"
        __import__("time").sleep(0.3)
    slurm.run(["scontrol", "requeue", f"{job}_1"])
    waited = torchhpc(slurm_cluster, "wait", f"slurm:{job}", "--timeout", "400", cwd=tmp_path, timeout=420)
    assert waited.returncode == 0, waited.stderr
    st = json.loads(torchhpc(slurm_cluster, "status", "--json", f"slurm:{job}", cwd=tmp_path).stdout)
    restarts = {t["job_id"]: t["restarts"] for t in st["tasks"]}
    assert restarts == {f"{job}_0": 0, f"{job}_1": 1}, st
    text1 = text_of(1)  # both attempts: the requeued task appends to its rank's file
    starts = [int(s) for s in re.findall(r"START step=(\d+) .*?restart=1", text1)]
    assert starts and starts[0] >= 5, text1  # resumed from a checkpoint, not from step 0
    assert "DONE step=30 restart=1" in text1, text1
    assert "restart=1" not in text_of(0) and "DONE step=30 restart=0" in text_of(0)
