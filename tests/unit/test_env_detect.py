"""Every detector against synthetic environments, table-driven, traps included.

The Slurm and Open MPI mappings are trimmed copies of what the dev cluster's
real batch script, srun step and ``mpirun`` inside ``sbatch -N2
--ntasks-per-node=2`` saw (job 13); Kubeflow/RunAI/PBS/MPICH/MVAPICH cannot
run here, so their mappings follow the variables those launchers document.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from torchhpc.env import PRIORITY, DistEnv, derive_port, detect, explain
from torchhpc.errors import EnvironmentDetectionError

SLURM_JOB = {
    "SLURM_JOB_ID": "13",
    "SLURM_JOBID": "13",
    "SLURM_JOB_NODELIST": "node[1-2]",
    "SLURM_NODELIST": "node[1-2]",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_NNODES": "2",
    "SLURM_NTASKS": "4",
    "SLURM_NTASKS_PER_NODE": "2",
    "SLURM_TASKS_PER_NODE": "2(x2)",
}
# What the batch script itself sees: SLURM_PROCID=0 but no SLURM_STEP_*.
SLURM_BATCH = {**SLURM_JOB, "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}
SLURM_STEP = {
    **SLURM_JOB,
    "SLURM_STEP_ID": "0",
    "SLURM_STEPID": "0",
    "SLURM_STEP_NODELIST": "node[1-2]",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    "SLURM_PROCID": "3",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
}
# Rank 3 of `mpirun -np 4` inside that job: Open MPI's daemon step leaks SLURM_PROCID=0 of 1 task on node2.
OMPI_IN_SLURM = {
    **SLURM_JOB,
    "SLURM_STEP_ID": "1",
    "SLURM_STEP_NODELIST": "node2",
    "SLURM_STEP_NUM_NODES": "1",
    "SLURM_STEP_NUM_TASKS": "1",
    "SLURM_STEP_TASKS_PER_NODE": "1",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0",
    "OMPI_COMM_WORLD_RANK": "3",
    "OMPI_COMM_WORLD_SIZE": "4",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    "OMPI_COMM_WORLD_NODE_RANK": "1",
    "OMPI_MCA_orte_num_nodes": "2",
    "OMPI_MCA_ess_base_jobid": "1274347521",
}
OMPI_LOCAL = {
    "OMPI_COMM_WORLD_RANK": "1",
    "OMPI_COMM_WORLD_SIZE": "2",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    "OMPI_MCA_orte_num_nodes": "1",
    "OMPI_MCA_ess_base_jobid": "1274347521",
}
TORCHRUN = {
    "TORCHELASTIC_RUN_ID": "13",
    "RANK": "5",
    "WORLD_SIZE": "8",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "4",
    "GROUP_RANK": "1",
    "GROUP_WORLD_SIZE": "2",
    "ROLE_RANK": "5",
    "MASTER_ADDR": "10.77.0.11",
    "MASTER_PORT": "29400",
    "TORCHELASTIC_USE_AGENT_STORE": "True",
}
PBS = {"PBS_JOBID": "1234.pbs01", "PBS_NODEFILE": "/var/spool/pbs/aux/1234.pbs01", "PBS_O_WORKDIR": "/home/u"}
NODEFILE = "nodeA\nnodeA\nnodeB\nnodeB\n"
K8S = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443", "HOSTNAME": "job-worker-1"}


# What Kubeflow Trainer v2.3.0's torch plugin injects into node 1 of TrainJob "pi" (2 nodes x 4 processes):
# PET_NODE_RANK from the Job completion index, PET_MASTER_ADDR = NAME-node-0-0.NAME, port 29500.
TRAINJOB_POD = {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "4", "PET_NODE_RANK": "1",
                "PET_MASTER_ADDR": "pi-node-0-0.pi", "PET_MASTER_PORT": "29500"}
@dataclass
class Case:
    id: str
    env: dict[str, str]
    source: str
    rank: int
    world: int
    local: tuple[int, int]  # local_rank, local_world_size
    node: tuple[int, int]  # node_rank, num_nodes
    master: tuple[str, int]
    scheduler: str | None = None
    files: dict[str, str] = field(default_factory=dict)


CASES = [
    Case("torchrun", TORCHRUN, "torchrun", 5, 8, (1, 4), (1, 2), ("10.77.0.11", 29400)),
    Case(
        "torchrun-inside-srun",  # trap: srun's SLURM_PROCID is the node index, torchrun's RANK wins
        {**SLURM_STEP, "SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2", **TORCHRUN},
        "torchrun", 5, 8, (1, 4), (1, 2), ("10.77.0.11", 29400), scheduler="slurm",
    ),
    Case(
        "torchrun-style-no-elastic",  # torchhpc run / task shim: LOCAL_RANK but no TORCHELASTIC_RUN_ID
        {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
         "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "12345"},
        "torchrun", 1, 2, (1, 2), (0, 1), ("127.0.0.1", 12345),
    ),
    Case("slurm-step", SLURM_STEP, "slurm", 3, 4, (1, 2), (1, 2), ("node1", 10013), scheduler="slurm"),
    Case(
        "slurm-step-uneven",
        {**SLURM_STEP, "SLURM_STEP_NUM_TASKS": "3", "SLURM_STEP_TASKS_PER_NODE": "2,1",
         "SLURM_PROCID": "2", "SLURM_LOCALID": "0", "SLURM_NODEID": "1"},
        "slurm", 2, 3, (0, 1), (1, 2), ("node1", 10013), scheduler="slurm",
    ),
    Case(
        "slurm-step-master-from-batch",  # the batch script exported MASTER_*: they win
        {**SLURM_STEP, "MASTER_ADDR": "10.77.0.11", "MASTER_PORT": "10013"},
        "slurm", 3, 4, (1, 2), (1, 2), ("10.77.0.11", 10013), scheduler="slurm",
    ),
    Case(
        "slurm-step-odd-hostlist",
        {**SLURM_STEP, "SLURM_STEP_NODELIST": "a1-[1-3]-b,gpu[07,09]"},
        "slurm", 3, 4, (1, 2), (1, 2), ("a1-1-b", 10013), scheduler="slurm",
    ),
    Case(
        "slurm-batch-is-not-rank-0-of-4",  # trap
        SLURM_BATCH, "local", 0, 1, (0, 1), (0, 1), ("127.0.0.1", 10013), scheduler="slurm",
    ),
    Case(
        "openmpi-inside-slurm",  # trap: the orted step's SLURM_PROCID=0 of 1 must lose
        OMPI_IN_SLURM, "openmpi", 3, 4, (1, 2), (1, 2), ("node1", 10013), scheduler="slurm",
    ),
    Case(
        "openmpi-one-host", OMPI_LOCAL, "openmpi", 1, 2, (1, 2), (0, 1),
        ("127.0.0.1", derive_port("1274347521")),
    ),
    Case(
        "openmpi-seed003-x-master",  # mpirun -x MASTER_ADDR=$(hostname) -x MASTER_PORT=...
        {**OMPI_LOCAL, "OMPI_MCA_orte_num_nodes": "2", "MASTER_ADDR": "se001", "MASTER_PORT": "29600"},
        "openmpi", 1, 2, (1, 2), (0, 2), ("se001", 29600),
    ),
    Case(
        "openmpi-under-pbs",
        {**PBS, "OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4",
         "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"},
        "openmpi", 3, 4, (1, 2), (1, 2), ("nodeA", 11234), scheduler="pbs",
        files={PBS["PBS_NODEFILE"]: NODEFILE},
    ),
    Case(
        "mpich-hydra",
        {"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2", "MASTER_ADDR": "h0"},
        "mpich", 2, 4, (0, 2), (1, 2), ("h0", 29500),
    ),
    Case(
        "intel-mpi-in-slurm",
        {**SLURM_BATCH, "PMI_RANK": "1", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"},
        "mpich", 1, 4, (1, 2), (0, 2), ("node1", 10013), scheduler="slurm",
    ),
    Case(
        "mvapich",
        {"MV2_COMM_WORLD_RANK": "1", "MV2_COMM_WORLD_SIZE": "2",
         "MV2_COMM_WORLD_LOCAL_RANK": "1", "MV2_COMM_WORLD_LOCAL_SIZE": "2"},
        "mvapich", 1, 2, (1, 2), (0, 1), ("127.0.0.1", 29500),
    ),
    Case(
        "kubeflow-old-operator",  # WORLD_SIZE = pods, RANK = pod index, one process per pod
        {**K8S, "MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "3", "RANK": "2"},
        "kubeflow", 2, 3, (0, 1), (2, 3), ("job-master-0", 23456), scheduler="kubernetes",
    ),
    Case(
        "kubeflow-new-operator-nproc1",
        {**K8S, "MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "2", "RANK": "1",
         "PET_NPROC_PER_NODE": "1", "PET_NODE_RANK": "1", "PET_NNODES": "2"},
        "kubeflow", 1, 2, (0, 1), (1, 2), ("job-master-0", 23456), scheduler="kubernetes",
    ),
    Case(
        "torchrun-inside-kubeflow-pod",  # torchrun's worker: process ranks replace pod ranks
        {**K8S, "PET_NPROC_PER_NODE": "4", "PET_NODE_RANK": "1", "PET_NNODES": "2", **TORCHRUN},
        "torchrun", 5, 8, (1, 4), (1, 2), ("10.77.0.11", 29400), scheduler="kubernetes",
    ),
    Case(
        "trainjob-pod-nproc1",  # Kubeflow Trainer v2: only PET_* (the controller's five), no RANK/MASTER_ADDR
        {**K8S, **TRAINJOB_POD, "PET_NPROC_PER_NODE": "1"},
        "trainjob", 1, 2, (0, 1), (1, 2), ("pi-node-0-0.pi", 29500), scheduler="kubernetes",
    ),
    Case(
        "trainjob-pod-torchrun-worker",  # torchrun inside the TrainJob pod: its worker's ranks win
        {**K8S, **TRAINJOB_POD, **TORCHRUN},
        "torchrun", 5, 8, (1, 4), (1, 2), ("10.77.0.11", 29400), scheduler="kubernetes",
    ),
    Case(
        "trainjob-pod-with-local-rank",  # a worker started by hand with LOCAL_RANK: node 1, local 3 of 4
        {**K8S, **TRAINJOB_POD, "LOCAL_RANK": "3"},
        "trainjob", 7, 8, (3, 4), (1, 2), ("pi-node-0-0.pi", 29500), scheduler="kubernetes",
    ),
    Case(
        "runai-pods",  # seed 004: WORLD_SIZE/RANK count pods
        {**K8S, "RUNAI_JOB_NAME": "my-first-distributed-app", "MASTER_ADDR": "10.0.0.5",
         "MASTER_PORT": "29500", "WORLD_SIZE": "4", "RANK": "3"},
        "runai", 3, 4, (0, 1), (3, 4), ("10.0.0.5", 29500), scheduler="runai",
    ),
    Case(
        "pbs-job-script", PBS, "pbs", 0, 1, (0, 1), (0, 1), ("127.0.0.1", 11234), scheduler="pbs",
        files={PBS["PBS_NODEFILE"]: NODEFILE},
    ),
    Case(
        "manual-rank-world",
        {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h0", "MASTER_PORT": "1234"},
        "env", 1, 2, (0, 1), (1, 2), ("h0", 1234),
    ),
    Case("nothing", {}, "local", 0, 1, (0, 1), (0, 1), ("127.0.0.1", 29500)),
]


def _reader(files: dict[str, str]):
    def read(path: str) -> str:
        if path not in files:
            raise FileNotFoundError(2, "No such file or directory", path)
        return files[path]

    return read


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_detect(case: Case) -> None:
    got = detect(case.env, read_file=_reader(case.files))
    assert isinstance(got, DistEnv)
    assert (got.source, got.rank, got.world_size) == (case.source, case.rank, case.world)
    assert (got.local_rank, got.local_world_size) == case.local
    assert (got.node_rank, got.num_nodes) == case.node
    assert (got.master_addr, got.master_port) == case.master
    assert got.scheduler == case.scheduler


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_explain_agrees_with_detect(case: Case) -> None:
    verdicts = explain(case.env, read_file=_reader(case.files))
    assert [v.name for v in verdicts] == [d.name for d, _ in PRIORITY]
    chosen = [v for v in verdicts if v.chosen]
    assert len(chosen) == 1 and chosen[0].name == case.source
    assert chosen[0].env == detect(case.env, read_file=_reader(case.files))
    assert all(v.priority_reason and v.reason for v in verdicts)


def test_slurm_step_ranks_all_agree_on_master() -> None:
    """Every task of a 2x2 step computes the same master and port without talking."""
    seen = set()
    for rank, (node, local) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):
        env = {**SLURM_STEP, "SLURM_PROCID": str(rank), "SLURM_NODEID": str(node), "SLURM_LOCALID": str(local)}
        got = detect(env)
        assert (got.rank, got.node_rank, got.local_rank) == (rank, node, local)
        seen.add((got.master_addr, got.master_port))
    assert seen == {("node1", 10013)}


def test_batch_script_verdict_says_why() -> None:
    slurm = next(v for v in explain(SLURM_BATCH) if v.name == "slurm")
    assert not slurm.matched
    assert "not an srun task" in slurm.reason


ERRORS = [
    ("bad-int", {"RANK": "abc", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "RANK='abc'"),
    ("rank-outside-world", {"RANK": "4", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "MASTER_ADDR": "h"}, "rank=4"),
    ("local-rank-outside", {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2",
                            "MASTER_ADDR": "h"}, "local_rank=2"),
    (
        "kubeflow-pods-with-4-procs-no-local-rank",  # trap: RANK=1 is the pod, not the process
        {**K8S, "MASTER_ADDR": "m", "MASTER_PORT": "1", "WORLD_SIZE": "8", "RANK": "1",
         "PET_NPROC_PER_NODE": "4", "PET_NODE_RANK": "1", "PET_NNODES": "2"},
        "pod's index",
    ),
    (
        "trainjob-pod-4-procs-no-local-rank",  # the pod's shell is not a rank; the message still names its place
        {**K8S, **TRAINJOB_POD},
        "node 1 of 2, 4 processes per node (world size 8), master pi-node-0-0.pi:29500",
    ),
    ("trainjob-auto-nproc", {**K8S, **TRAINJOB_POD, "PET_NPROC_PER_NODE": "auto"}, "decided by torchrun"),
    ("kubeflow-elastic-range", {**K8S, "RANK": "0", "WORLD_SIZE": "2", "PET_NNODES": "1:3"}, "elastic"),
    ("kubeflow-no-master", {**K8S, "RANK": "0", "WORLD_SIZE": "2"}, "MASTER_ADDR"),
    (
        "mpi-multi-host-no-master",
        {**OMPI_LOCAL, "OMPI_COMM_WORLD_SIZE": "4", "OMPI_MCA_orte_num_nodes": "2"},
        "MASTER_ADDR",
    ),
    ("manual-multi-no-master", {"RANK": "0", "WORLD_SIZE": "2"}, "MASTER_ADDR"),
    ("bad-master-port", {**SLURM_STEP, "MASTER_PORT": "70000"}, "master_port=70000"),
    ("bad-tasks-per-node", {**SLURM_STEP, "SLURM_STEP_TASKS_PER_NODE": "two"}, "SLURM_STEP_TASKS_PER_NODE"),
]


@pytest.mark.parametrize(("env", "needle"), [(e, n) for _, e, n in ERRORS], ids=[i for i, _, _ in ERRORS])
def test_detect_refuses_to_guess(env: dict[str, str], needle: str) -> None:
    with pytest.raises(EnvironmentDetectionError) as info:
        detect(env)
    assert needle in str(info.value)
    assert info.value.hint
    # explain() reports the same problem instead of raising
    chosen = next(v for v in explain(env) if v.chosen)
    assert chosen.error is not None and needle in str(chosen.error)


def test_unreadable_nodefile_is_reported_not_fatal() -> None:
    env = {**PBS}
    got = detect(env, read_file=_reader({}))
    assert got.source == "pbs" and got.world_size == 1
    pbs = next(v for v in explain(env, read_file=_reader({})) if v.name == "pbs")
    assert "unreadable" in pbs.reason


def test_detect_defaults_to_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(__import__("os").environ):
        if name.startswith(("SLURM_", "OMPI_", "PMI_", "PBS_", "MV2_", "PET_", "RUNAI_", "KUBERNETES_")) or name in (
            "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "GROUP_RANK"
        ):
            monkeypatch.delenv(name)
    for k, v in SLURM_STEP.items():
        monkeypatch.setenv(k, v)
    assert detect().rank == 3
