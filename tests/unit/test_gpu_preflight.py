"""The NCCL pre-flight: more local ranks than GPUs is refused before ``init_process_group``.

The arithmetic (torchhpc.core.gpus) is pure. The ``dist.init`` tests FAKE
``torch.cuda`` (this machine has no GPU): ``is_available``/``device_count``/
``set_device`` answer as a 1-GPU node would, and ``init_process_group`` is
replaced by a recorder so the test proves it was never reached. The last test
runs two real ranks under ``torchhpc run -n 2`` with the same fake installed
by the script itself, and checks what a user sees: Error + HINT lines, no
traceback, a non-zero exit.
"""

from __future__ import annotations

import os
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import PYTHON, REPO, need
from torchhpc.core.gpus import (
    needs_gpu_per_rank,
    ranks_per_gpu_error,
    requested_geometry_error,
    visible_devices,
)
from torchhpc.errors import UsageError


def test_arithmetic() -> None:
    assert ranks_per_gpu_error(2, 2) is None and ranks_per_gpu_error(1, 1) is None
    assert ranks_per_gpu_error(4, 8) is None  # fewer ranks than GPUs: allowed (some idle)
    assert ranks_per_gpu_error(2, 0) is None  # no GPU: the backend choice refuses nccl, not this
    assert ranks_per_gpu_error(2, 1, backend="gloo") is None  # gloo ranks may share a GPU
    err = ranks_per_gpu_error(2, 1, visible="CUDA_VISIBLE_DEVICES=0")
    assert isinstance(err, UsageError) and err.exit_code == 2
    assert err.message == "2 ranks on this node with backend 'nccl' but 1 GPU visible (CUDA_VISIBLE_DEVICES=0): NCCL needs one GPU per rank"
    assert err.hint is not None and "--nproc-per-node 1" in err.hint and "--gpus-per-node 2" in err.hint
    err = ranks_per_gpu_error(8, 4, backend="cpu:gloo,cuda:nccl", gpus_from="requested (--gpus-per-node)", where="each node")
    assert err is not None and "8 ranks on each node" in err.message and "4 GPUs requested (--gpus-per-node)" in err.message
    assert "--nproc-per-node 4" in (err.hint or "")


def test_requested_geometry() -> None:
    assert requested_geometry_error(4, 4, {}) is None and requested_geometry_error(2, 0, {}) is None  # no GPUs asked
    err = requested_geometry_error(8, 4, {})
    assert err is not None and err.message == (
        "8 ranks on each node with backend 'nccl' but 4 GPUs requested (--gpus-per-node): NCCL needs one GPU per rank")
    assert err.hint == ("use --nproc-per-node 4 or --gpus-per-node 8; ranks that do not use NCCL may share GPUs: "
                        "say so with -e TORCHHPC_BACKEND=gloo")
    assert requested_geometry_error(8, 4, {"TORCHHPC_BACKEND": "gloo"}) is None
    assert requested_geometry_error(8, 4, {"TORCHHPC_BACKEND": "cpu:gloo,cuda:nccl"}) is not None


def test_rendered_jobs_refuse_more_ranks_than_requested_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    """Through the CLI's dry run, for a batch script and for the local scheduler: exit 2, Error + HINT."""
    from torchhpc.cli.main import main

    for sched in ("slurm", "pbs", "local"):
        assert main(["run", "-s", sched, "--gpus-per-node", "2", "-n", "4", "--dry-run", "train.py"]) == 2
        err = capsys.readouterr().err
        assert "Error: 4 ranks on each node with backend 'nccl' but 2 GPUs requested (--gpus-per-node)" in err, err
        assert "HINT: use --nproc-per-node 2 or --gpus-per-node 4" in err
    assert main(["run", "-s", "slurm", "--gpus-per-node", "2", "-n", "4", "-e", "TORCHHPC_BACKEND=gloo", "--dry-run", "train.py"]) == 0
    assert "#SBATCH --gpus-per-node=2" in capsys.readouterr().out


def test_backend_and_visibility_text() -> None:
    assert needs_gpu_per_rank("nccl") and needs_gpu_per_rank("cpu:gloo,cuda:nccl")
    assert not needs_gpu_per_rank("gloo") and not needs_gpu_per_rank("mpi")
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "0,1"}) == "CUDA_VISIBLE_DEVICES=0,1"
    assert visible_devices({"ROCR_VISIBLE_DEVICES": "3"}) == "ROCR_VISIBLE_DEVICES=3"
    assert visible_devices({}) == "CUDA_VISIBLE_DEVICES unset"


torch = need("torch")
import torch.distributed as dist  # noqa: E402

import torchhpc.dist as thd  # noqa: E402


@pytest.fixture
def one_gpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[object]]:
    """FAKE: a node with one CUDA device; returns the calls that reached init_process_group."""
    calls: list[object] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: None)
    monkeypatch.setattr(dist, "init_process_group", lambda **kw: calls.append(kw))
    thd.cleanup()
    yield calls
    thd.cleanup()


def _torchrun_env(local_world: int, **extra: str) -> dict[str, str]:
    return {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": str(local_world), "LOCAL_WORLD_SIZE": str(local_world),
            "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511",
            "TORCHELASTIC_RUN_ID": "t", **extra}


def test_init_refuses_two_ranks_on_one_gpu_before_the_group(one_gpu: list[object]) -> None:
    with pytest.raises(UsageError) as e:
        thd.init(env=_torchrun_env(2, CUDA_VISIBLE_DEVICES="0"), export_env=False)
    assert "2 ranks on this node with backend 'nccl' but 1 GPU visible (CUDA_VISIBLE_DEVICES=0)" in e.value.message
    assert one_gpu == []  # never reached init_process_group
    assert thd.current() is None


def test_init_allows_gloo_and_narrowed_srun_tasks(one_gpu: list[object]) -> None:
    ctx = thd.init("gloo", env=_torchrun_env(2), export_env=False)  # gloo may share the GPU
    assert ctx.backend == "gloo" and len(one_gpu) == 1
    thd.cleanup()
    # srun with one GPU per task: every task sees one GPU, its own; Slurm holds 4 on the node.
    srun = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_LOCALID": "1", "SLURM_NTASKS": "4",
            "SLURM_NNODES": "1", "SLURM_NODEID": "0", "SLURM_STEP_NUM_TASKS": "4", "SLURM_STEP_TASKS_PER_NODE": "4",
            "SLURM_STEP_NODELIST": "n1", "SLURM_GPUS_ON_NODE": "4", "CUDA_VISIBLE_DEVICES": "0",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29512"}
    ctx = thd.init(env=srun, export_env=False)
    assert ctx.backend == "nccl" and ctx.local_world_size == 4 and len(one_gpu) == 2
    thd.cleanup()
    # ... but 4 tasks on a node where the job holds 2 GPUs must share them.
    with pytest.raises(UsageError, match=r"4 ranks on this node .* 2 GPUs allocated to the job here \(SLURM_GPUS_ON_NODE\)"):
        thd.init(env={**srun, "SLURM_GPUS_ON_NODE": "2"}, export_env=False)
    assert len(one_gpu) == 2


SCRIPT = """
import torch, torch.distributed as dist
# FAKE (no GPU on this machine): one CUDA device, and an NCCL init that would fail like NCCL does.
torch.cuda.is_available = lambda: True
torch.cuda.device_count = lambda: 1
torch.cuda.set_device = lambda d: None
def nccl(**kw):
    raise RuntimeError("Duplicate GPU detected : rank 0 and rank 1 both on CUDA device")
dist.init_process_group = nccl
import torchhpc.dist as thd
with thd.init() as ctx:
    print("trained", flush=True)
"""


def test_two_ranks_on_one_gpu_under_torchhpc_run(tmp_path: Path) -> None:
    script = tmp_path / "nccl_job.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="0")
    cp = subprocess.run([PYTHON, "-m", "torchhpc", "run", "-n", "2", str(script)], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=120)
    out = cp.stdout + cp.stderr
    assert cp.returncode != 0, out
    assert "Traceback" not in out and "Duplicate GPU" not in out and "trained" not in out, out
    assert "Error: 2 ranks on this node with backend 'nccl' but 1 GPU visible (CUDA_VISIBLE_DEVICES=0)" in out, out
    assert "HINT: start at most 1 rank per node (--nproc-per-node 1)" in out, out
