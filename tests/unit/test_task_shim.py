"""The per-task shim, run by a real bash with the variables each launcher really sets.

The environments are written by hand from what srun, Open MPI's orted (started by
srun, one task per node) and torchrun export; the dev cluster matrix
(tests/integration/test_compat_matrix.py) proves the same rule end to end.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.conftest import missing
from tests.script_text import lines
from torchhpc.launchers.boot import TASK_SH, task_argv

PRINT = "env -0"

# srun step of OpenMPI's daemons or of torchrun agents: one task per node, node 1 of 2.
NODE_STEP = {
    "SLURM_JOB_ID": "77",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_NNODES": "2",
    "SLURM_STEP_ID": "0",
    "SLURM_STEPID": "0",
    "SLURM_STEP_NODELIST": "node[1-2]",
    "SLURM_CPUS_PER_TASK": "3",
    "SLURM_PROCID": "1",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "1",
    "SLURM_NTASKS": "2",
    "SLURM_NPROCS": "2",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_NTASKS_PER_NODE": "1",
    "SLURM_TASKS_PER_NODE": "1(x2)",
    "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
    "SLURM_GTIDS": "1",
}
OMPI_RANK3 = {
    "OMPI_COMM_WORLD_RANK": "3",
    "OMPI_COMM_WORLD_SIZE": "4",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    "OMPI_COMM_WORLD_NODE_RANK": "1",
    "OMPI_MCA_btl": "self,tcp",
}
TORCHRUN_RANK3 = {
    "RANK": "3",
    "WORLD_SIZE": "4",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "1",
    "GROUP_WORLD_SIZE": "2",
    "ROLE_RANK": "3",
    "TORCHELASTIC_RUN_ID": "77",
    "TORCHELASTIC_USE_AGENT_STORE": "True",
}
# The job and step identity Slurm itself needs (srun, scontrol, requeue, binding): never touched.
SLURM_OWN = ("SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_STEPID", "SLURM_STEP_NODELIST", "SLURM_CPUS_PER_TASK", "SLURM_NNODES")


def run_shim(env: dict[str, str], launcher: str | None) -> dict[str, str]:
    if shutil.which("bash") is None:
        missing("bash is not installed")
    argv = task_argv(["bash", "-c", PRINT], launcher=launcher)
    done = subprocess.run(argv, env={"PATH": "/usr/bin:/bin", **env}, capture_output=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr.decode()
    return dict(item.split("=", 1) for item in done.stdout.decode().split("\0") if "=" in item)


def assert_rank3(out: dict[str, str]) -> None:
    for name, value in {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1"}.items():
        assert out[name] == value, (name, out)


@pytest.mark.parametrize("launcher", ["mpirun", None])
def test_mpirun_rewrites_the_daemons_slurm_step_to_the_rank(launcher: str | None) -> None:
    out = run_shim({**NODE_STEP, **OMPI_RANK3}, launcher)
    assert_rank3(out)
    assert out["SLURM_PROCID"] == "3" and out["SLURM_LOCALID"] == "1" and out["SLURM_NODEID"] == "1"
    assert out["SLURM_NTASKS"] == out["SLURM_NPROCS"] == out["SLURM_STEP_NUM_TASKS"] == "4"
    assert out["SLURM_NTASKS_PER_NODE"] == "2"
    assert out["SLURM_TASKS_PER_NODE"] == out["SLURM_STEP_TASKS_PER_NODE"] == "2(x2)"
    assert out["SLURM_GTIDS"] == "2,3"
    for name in SLURM_OWN:
        assert out[name] == NODE_STEP[name], name
    assert out["OMPI_COMM_WORLD_RANK"] == "3" and out["OMPI_MCA_btl"] == "self,tcp"


def test_mpirun_rank_on_a_remote_node_sees_the_whole_launch_not_the_daemons_one_node_step() -> None:
    """Open MPI starts its daemons with srun on the *other* nodes only (mpirun forks its own node's
    ranks): that step has one node, so SLURM_NNODES=1 and the step node list names one host."""
    step = {**NODE_STEP, "SLURM_NNODES": "1", "SLURM_STEP_NUM_NODES": "1", "SLURM_NODEID": "0", "SLURM_PROCID": "0",
            "SLURM_NODELIST": "node2", "SLURM_STEP_NODELIST": "node2", "SLURM_JOB_NODELIST": "node[1-2]"}
    out = run_shim({**step, **OMPI_RANK3}, "mpirun")
    assert out["SLURM_NNODES"] == out["SLURM_STEP_NUM_NODES"] == "2" and out["SLURM_NODEID"] == "1"
    assert out["SLURM_NODELIST"] == out["SLURM_STEP_NODELIST"] == "node[1-2]"
    assert out["SLURM_JOB_NUM_NODES"] == "2" and out["SLURM_STEP_ID"] == "0"


def test_torchrun_worker_gets_its_own_slurm_values_and_keeps_torchelastic() -> None:
    out = run_shim({**NODE_STEP, **TORCHRUN_RANK3, "PMI_RANK": "1", "PMI_SIZE": "2"}, "torchrun")
    assert_rank3(out)
    assert out["SLURM_PROCID"] == "3" and out["SLURM_NTASKS"] == "4" and out["SLURM_STEP_TASKS_PER_NODE"] == "2(x2)"
    assert out["TORCHELASTIC_RUN_ID"] == "77" and out["TORCHELASTIC_USE_AGENT_STORE"] == "True"
    assert out["GROUP_WORLD_SIZE"] == "2"
    assert "PMI_RANK" not in out and "PMI_SIZE" not in out  # the step's PMI rank is the node's, not ours


def test_torchrun_rank_on_another_node_than_slurm_says() -> None:
    """c10d rendezvous may give node 1 group rank 0: SLURM_NODEID follows the rank, not the step."""
    env = {**NODE_STEP, **TORCHRUN_RANK3, "RANK": "1", "GROUP_RANK": "0"}
    out = run_shim(env, "torchrun")
    assert out["SLURM_PROCID"] == "1" and out["SLURM_NODEID"] == "0" and out["SLURM_GTIDS"] == "0,1"


def test_srun_keeps_slurm_and_drops_stale_mpi_and_elastic_variables() -> None:
    env = {
        **NODE_STEP,
        "SLURM_PROCID": "2",
        "SLURM_NODEID": "1",
        "SLURM_NTASKS": "4",
        "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
        "OMPI_COMM_WORLD_RANK": "0",
        "OMPI_COMM_WORLD_SIZE": "1",
        "OMPI_COMM_WORLD_LOCAL_RANK": "0",
        "MV2_COMM_WORLD_RANK": "5",
        "MV2_COMM_WORLD_SIZE": "9",
        "TORCHELASTIC_RUN_ID": "old",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "GROUP_WORLD_SIZE": "9",
        "ROLE_RANK": "9",
    }
    out = run_shim(env, "srun")
    assert (out["RANK"], out["WORLD_SIZE"], out["LOCAL_WORLD_SIZE"], out["GROUP_RANK"]) == ("2", "4", "2", "1")
    assert out["SLURM_PROCID"] == "2" and out["SLURM_GTIDS"] == NODE_STEP["SLURM_GTIDS"]  # srun's own: untouched
    gone = [n for n in out if n.startswith(("OMPI_COMM_WORLD_", "MV2_", "TORCHELASTIC_", "ROLE_")) or n == "GROUP_WORLD_SIZE"]
    assert gone == []


def test_srun_pmi2_values_that_agree_are_kept() -> None:
    env = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "2", "PMI_RANK": "1", "PMI_SIZE": "2"}
    out = run_shim(env, "srun")
    assert out["PMI_RANK"] == "1" and out["PMI_SIZE"] == "2"


def test_users_variables_with_short_names_are_not_clobbered() -> None:
    mine = {n: "mine" for n in ("_i", "_r", "_n", "_g", "_groups", "_v", "_launcher")}
    out = run_shim({**NODE_STEP, "SLURM_STEP_TASKS_PER_NODE": "2(x2)", **mine}, "srun")
    assert {n: out.get(n) for n in mine} == mine
    assert not [n for n in out if n.startswith("_torchhpc_")]


def test_no_launcher_is_one_process() -> None:
    out = run_shim({}, None)
    assert (out["RANK"], out["WORLD_SIZE"], out["MASTER_ADDR"], out["MASTER_PORT"]) == ("0", "1", "127.0.0.1", "29500")


@pytest.mark.parametrize(
    ("launcher", "env", "needle"),
    [
        ("mpirun", {}, "neither OMPI_COMM_WORLD_RANK nor PMI_RANK"),
        ("srun", {}, "SLURM_PROCID is not set"),
        ("torchrun", {"RANK": "0"}, "TORCHELASTIC_RUN_ID"),
    ],
)
def test_a_named_launcher_without_its_variables_fails_clearly(launcher: str, env: dict[str, str], needle: str) -> None:
    argv = task_argv(["true"], launcher=launcher)
    done = subprocess.run(argv, env={"PATH": "/usr/bin:/bin", **env}, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and needle in done.stderr


def test_the_launcher_is_the_first_argument() -> None:
    assert task_argv(["t"], launcher="torchrun") == ["bash", TASK_SH, "torchrun", "t"]
    assert task_argv(["t"]) == ["bash", TASK_SH, "auto", "t"]
    with pytest.raises(ValueError, match="unknown launcher"):
        task_argv(["t"], launcher="pdsh")
    done = subprocess.run(["bash", TASK_SH, "pdsh", "true"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "unknown launcher 'pdsh'" in done.stderr


def test_slurm_torchrun_workers_start_through_the_shim_and_pods_do_not() -> None:
    from torchhpc.core.spec import Entrypoint, JobSpec
    from torchhpc.schedulers.slurm.slurm import SlurmScheduler

    spec = JobSpec(entrypoint=Entrypoint.parse(["train.py", "--lr", "1"]), scheduler="slurm", launcher="torchrun",
                   nodes=2, nproc_per_node=2)
    script = SlurmScheduler().render(spec).script or ""
    launch = next(line for line in lines(script) if "torch.distributed.run" in line)
    # each worker: the log wrapper (its own file per rank), then the task shim, then the program
    assert '--no-python bash "$TORCHHPC_BOOT_DIR/rank.sh" RANK bash "$TORCHHPC_BOOT_DIR/task.sh" torchrun' in launch
    assert launch.rstrip(" &").endswith("train.py --lr 1")
    # the script carries no shell program: the shim and the log wrapper are files of the boot directory
    assert "TORCHELASTIC_RUN_ID" not in script and "_torchhpc_task_shim" not in script
