"""`torchhpc doctor` checks on fake inputs, and the real command on this machine.

Fakes: a FakeRunner answers for python (the torch probe), scontrol and the
container runtimes, and fake /sys, /proc and /dev trees stand in for GPU and
RDMA hardware, which this machine does not have. The last tests run the
real checks here (no GPU: warn, never fail).
"""

from __future__ import annotations

import json
import resource
import shutil
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.fakes import FakeRunner
from torchhpc.doctor import (
    CHECKS,
    Context,
    check_containers,
    check_geometry,
    check_gpus,
    check_interface,
    check_memlock,
    check_pip_torch,
    check_rdma,
    check_slurm,
    check_torch,
    run_checks,
)

TREES = REPO / "tests" / "data" / "sysfs"
TORCH_GPU = {"version": "2.3.0a0+6ddf5cf", "file": "/usr/local/lib/python3.10/dist-packages/torch/__init__.py",
             "cuda": "12.4", "hip": None, "cuda_available": True, "device_count": 4, "nccl": "2.20.5",
             "nccl_backend": True, "gloo_backend": True}


def ctx(env: dict[str, str] | None = None, torch: dict[str, object] | None = None, root: str = "/",
        in_job: bool | None = False, **responses: object) -> Context:
    runner = FakeRunner(responses=dict(responses))
    if torch is not None:
        runner.responses["python"] = json.dumps(torch) + "\n"
    return Context(environ=env or {}, runner=runner, root=root, in_job=in_job, python="python")


def test_torch_versions_and_missing_torch() -> None:
    c = check_torch(ctx(torch=TORCH_GPU))
    assert c.status == "pass" and "CUDA 12.4" in c.detail and "NCCL 2.20.5" in c.detail
    missing = {"error": "ModuleNotFoundError: No module named 'torch'"}
    assert check_torch(ctx(torch=missing)).status == "warn"  # login node: torch optional
    bad = check_torch(ctx(torch=missing, in_job=True))
    assert bad.status == "fail" and bad.hint


def test_gpus_visible_vs_requested(tmp_path: Path) -> None:
    assert check_gpus(ctx(torch=TORCH_GPU, env={"SLURM_GPUS_ON_NODE": "4"})).status == "pass"
    none = {**TORCH_GPU, "cuda_available": False, "device_count": 0}
    c = check_gpus(ctx(torch=none, env={"SLURM_GPUS_ON_NODE": "4", "CUDA_VISIBLE_DEVICES": ""}))
    assert c.status == "fail" and "4 GPUs requested" in c.detail and c.hint
    assert check_gpus(ctx(torch=none, root=str(tmp_path))).status == "warn"  # no GPU, none asked for
    two = {**TORCH_GPU, "device_count": 2}
    c = check_gpus(ctx(torch=two, env={"SLURM_GPUS_PER_NODE": "h100:4", "CUDA_VISIBLE_DEVICES": "0,1"}))
    assert c.status == "warn" and "CUDA_VISIBLE_DEVICES=0,1" in c.detail
    # One GPU per task under srun --gpus-per-task=1 is by design, not a shortage.
    one = {**TORCH_GPU, "device_count": 1}
    c = check_gpus(ctx(torch=one, env={"SLURM_GPUS_ON_NODE": "4", "SLURM_LOCALID": "2", "CUDA_VISIBLE_DEVICES": "2"},
                       in_job=True))
    assert c.status == "pass" and "local rank 2 sees 1" in c.detail


def test_gpus_without_torch_count_device_nodes(tmp_path: Path) -> None:
    (tmp_path / "dev").mkdir()
    for i in range(4):
        (tmp_path / "dev" / f"nvidia{i}").touch()
    (tmp_path / "dev" / "nvidiactl").touch()
    c = check_gpus(ctx(torch={"error": "no torch"}, root=str(tmp_path)))
    assert c.status == "pass" and "4 GPUs" in c.detail


def test_memlock_matters_with_rdma() -> None:
    def limited(_which: int) -> tuple[int, int]:
        return 64 * 1024, 64 * 1024

    def unlimited(_which: int) -> tuple[int, int]:
        return resource.RLIM_INFINITY, resource.RLIM_INFINITY

    roce = str(TREES / "connectx-roce")
    assert check_memlock(ctx(root=roce), limits=limited).status == "fail"
    assert check_memlock(ctx(root=str(TREES / "no-fabric")), limits=limited).status == "warn"
    assert check_memlock(ctx(root=roce), limits=unlimited).status == "pass"


def test_rdma_devices_inside_the_container(tmp_path: Path) -> None:
    c = check_rdma(ctx(root=str(TREES / "connectx-roce")))
    assert c.status == "fail" and "uverbs" in c.detail and "/dev/infiniband" in (c.hint or "")
    root = tmp_path / "node"
    shutil.copytree(TREES / "connectx-roce", root)
    (root / "dev/infiniband").mkdir(parents=True)
    (root / "dev/infiniband/uverbs0").touch()
    c = check_rdma(ctx(root=str(root)))
    assert c.status == "pass" and "mlx5_bond_0:1" in c.detail
    assert check_rdma(ctx(root=str(TREES / "no-fabric"))).status == "skip"


def test_interface_reaches_the_master() -> None:
    nf = str(TREES / "no-fabric")
    c = check_interface(ctx(env={"MASTER_ADDR": "10.0.0.1"}, root=nf))
    assert c.status == "pass" and c.detail.startswith("eth0")
    c = check_interface(ctx(env={"MASTER_ADDR": "10.0.0.1", "NCCL_SOCKET_IFNAME": "ib0"}, root=nf))
    assert c.status == "fail" and "ib0" in c.detail and "eth0" in (c.hint or "")
    ok = check_interface(ctx(env={"MASTER_ADDR": "10.0.0.1", "NCCL_SOCKET_IFNAME": "^docker,lo"}, root=nf))
    assert ok.status == "pass"
    assert check_interface(ctx(root=nf)).status == "skip"


def test_slurm_reachability() -> None:
    assert check_slurm(ctx()).status == "skip"  # FakeRunner: no srun/scontrol/sbatch
    up = "Slurmctld(primary) at ctl is UP\n"
    env = {"SLURM_JOB_ID": "1"}
    c = check_slurm(ctx(env=env, srun="", sbatch="", squeue="", scancel="", scontrol=up))
    assert c.status == "pass" and "UP" in c.detail
    c = check_slurm(ctx(env=env, srun="", sbatch="", scontrol=up))
    assert c.status == "warn" and "missing squeue,scancel" in c.detail
    c = check_slurm(ctx(env=env, srun="", sbatch="", scontrol=(1, "Slurmctld(primary) at ctl is DOWN\n", "")))
    assert c.status == "fail" and c.hint


def test_container_runtimes() -> None:
    game = "singularity: a game of simple text adventure 0.30c\n"  # Debian's `singularity` package
    c = check_containers(ctx(singularity=game, podman="podman version 4.3.1\n"))
    assert c.status == "warn" and "podman 4.3.1" in c.detail and "not the container runtime" in c.detail
    c = check_containers(ctx(apptainer="apptainer version 1.3.4\n"))
    assert c.status == "pass" and "apptainer 1.3.4" in c.detail
    assert check_containers(ctx()).status == "skip"


@pytest.mark.parametrize(
    "env, status",
    [
        ({"SLURM_JOB_ID": "1", "SLURM_NTASKS_PER_NODE": "4", "TORCHELASTIC_RUN_ID": "1", "LOCAL_WORLD_SIZE": "4"}, "fail"),
        ({"SLURM_JOB_ID": "1", "SLURM_NTASKS_PER_NODE": "1", "TORCHELASTIC_RUN_ID": "1"}, "pass"),
        ({"SLURM_JOB_ID": "1", "SLURM_NTASKS_PER_NODE": "4", "SLURM_NTASKS": "8", "WORLD_SIZE": "8",
          "SLURM_GPUS_ON_NODE": "4"}, "pass"),
        ({"SLURM_JOB_ID": "1", "SLURM_NTASKS_PER_NODE": "4", "SLURM_NTASKS": "8", "WORLD_SIZE": "2"}, "fail"),
        ({"SLURM_JOB_ID": "1", "SLURM_NTASKS_PER_NODE": "2", "SLURM_GPUS_ON_NODE": "4"}, "warn"),
    ],
)
def test_task_geometry(env: dict[str, str], status: str) -> None:
    assert check_geometry(ctx(env=env, in_job=True)).status == status


def test_pip_could_replace_base_torch(tmp_path: Path) -> None:
    c = check_pip_torch(ctx(torch=TORCH_GPU, env={"VIRTUAL_ENV": "/home/u/venv"}))
    assert c.status == "warn" and "outside the venv" in c.detail and "PIP_CONSTRAINT" in (c.hint or "")
    pins = tmp_path / "c.txt"
    pins.write_text("torch==2.3.0a0+6ddf5cf\n")
    c = check_pip_torch(ctx(torch=TORCH_GPU, env={"PIP_CONSTRAINT": str(pins)}))
    assert c.status == "pass"
    inside = {**TORCH_GPU, "file": "/home/u/venv/lib/python3.10/site-packages/torch/__init__.py"}
    assert check_pip_torch(ctx(torch=inside, env={"VIRTUAL_ENV": "/home/u/venv"})).status == "pass"


def test_a_crashing_check_is_reported_not_raised() -> None:
    c = Context(environ={}, runner=FakeRunner(), in_job=False, python="python")
    c._torch = {"version": object()}  # garbage: check_torch must not take the doctor down
    results = run_checks(c, only=["torch"])
    assert results[0].status in ("pass", "fail")


def test_in_job_is_detected_from_the_environment() -> None:
    assert Context(environ={"SLURM_STEP_ID": "0"}, runner=FakeRunner()).in_job is True
    assert Context(environ={"SLURM_JOB_ID": "5"}, runner=FakeRunner()).in_job is False  # salloc shell


def test_real_doctor_on_this_machine(capsys: pytest.CaptureFixture[str]) -> None:
    from torchhpc.cli.main import main

    main(["doctor", "--json", "--login", "--no-torch"])
    data = json.loads(capsys.readouterr().out)
    names = [c["name"] for c in data["checks"]]
    assert names == [n for n, _ in CHECKS]
    by = {c["name"]: c for c in data["checks"]}
    assert by["gpus"]["status"] in ("warn", "pass")  # no GPU here: never a failure
    assert by["python"]["status"] == "pass"
    for c in data["checks"]:
        assert c["status"] in ("pass", "warn", "fail", "skip")
        if c["status"] == "fail":
            assert c["hint"], c
