"""How :func:`torchhpc.dist.init` starts the default process group: device, backend, preflight, rendezvous.

Kept apart from :mod:`torchhpc.dist.context`, which holds what a training script
keeps (the :class:`~torchhpc.dist.context.DistContext`, ``cleanup``, ``print0``): these
are the one-time choices ``init`` makes before a group exists, each refusing a bad
setup with a message that names its source (``backend=``, ``$TORCHHPC_BACKEND``,
two ranks on one GPU, an unreachable master) before torch fails with its own.

torch is imported inside functions only: ``import torchhpc.dist`` stays cheap.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from torchhpc.core.gpus import VISIBLE_VARIABLES, needs_gpu_per_rank, ranks_per_gpu_error, visible_devices
from torchhpc.env import DistEnv
from torchhpc.errors import EnvironmentDetectionError, UsageError

if TYPE_CHECKING:
    import torch

__all__ = ["BACKENDS", "pick_backend", "pick_device", "preflight", "start_group"]

BACKENDS = ("gloo", "nccl", "mpi", "ucc", "xccl")


def pick_device(dist_env: DistEnv, device: Any) -> torch.device:
    import torch

    if device is not None:
        dev = torch.device(device)
    elif torch.cuda.is_available() and torch.cuda.device_count() > 0:
        # With CUDA_VISIBLE_DEVICES narrowed to one GPU per task (srun --gpus-per-task)
        # the count is 1 and every local rank uses index 0.
        dev = torch.device("cuda", dist_env.local_rank % torch.cuda.device_count())
    else:
        dev = torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    return dev


def pick_backend(backend: str | None, dev: torch.device, environ: Mapping[str, str]) -> str:
    chosen = backend or environ.get("TORCHHPC_BACKEND") or ("nccl" if dev.type == "cuda" else "gloo")
    source = "backend=" if backend else ("TORCHHPC_BACKEND" if environ.get("TORCHHPC_BACKEND") else "default")
    names = [part.split(":")[-1] for part in chosen.split(",")]
    unknown = [n for n in names if n not in BACKENDS]
    if unknown:
        raise UsageError(
            f"backend {chosen!r} (from {source}) is not a torch.distributed backend",
            f"use one of {', '.join(BACKENDS)} (or 'cpu:gloo,cuda:nccl')",
        )
    if chosen == "nccl" and dev.type != "cuda":
        raise UsageError(
            f"backend 'nccl' (from {source}) needs a CUDA device but this rank runs on {dev}",
            "use backend='gloo' on CPU, or run where CUDA is available",
        )
    return chosen


def preflight(dist_env: DistEnv, backend: str, dev: torch.device, environ: Mapping[str, str]) -> None:
    """Refuse ranks that would share a GPU under NCCL, before any process group exists.

    Counted only where this process can know that its node's ranks share one
    set of GPUs: workers of torchrun (or ``torchhpc run``) inherit one
    visibility; Slurm says how many GPUs the job holds on this node; with no
    ``CUDA_VISIBLE_DEVICES`` every rank sees every GPU. An srun/mpirun task may
    be narrowed to its own GPU (``--gpus-per-task``, a wrapper exporting
    ``CUDA_VISIBLE_DEVICES=$SLURM_LOCALID``): one visible GPU per task is right there.
    """
    if dev.type != "cuda" or not needs_gpu_per_rank(backend) or dist_env.local_world_size < 2:
        return
    import torch

    visible = visible_devices(environ)
    if "TORCHELASTIC_RUN_ID" in environ or not any(v in environ for v in VISIBLE_VARIABLES):
        error = ranks_per_gpu_error(dist_env.local_world_size, torch.cuda.device_count(), backend=backend, visible=visible)
    elif environ.get("SLURM_GPUS_ON_NODE", "").isdigit():
        error = ranks_per_gpu_error(
            dist_env.local_world_size, int(environ["SLURM_GPUS_ON_NODE"]), backend=backend,
            gpus_from="allocated to the job here (SLURM_GPUS_ON_NODE)", visible=visible,
        )
    else:
        error = None
    if error is not None:
        raise error


def start_group(dist_env: DistEnv, backend: str, timeout: timedelta, environ: Mapping[str, str]) -> None:
    import torch.distributed as dist

    kwargs: dict[str, Any] = {"backend": backend, "timeout": timeout}
    if dist_env.world_size == 1:
        kwargs.update(store=dist.HashStore(), rank=0, world_size=1)
    elif environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true":
        # Under torchrun the agent already serves the store on MASTER_PORT; env://
        # knows to connect to it instead of binding the port a second time.
        kwargs.update(init_method="env://", rank=dist_env.rank, world_size=dist_env.world_size)
    else:
        host = dist_env.master_addr
        host = f"[{host}]" if ":" in host and not host.startswith("[") else host
        kwargs.update(
            init_method=f"tcp://{host}:{dist_env.master_port}",
            rank=dist_env.rank,
            world_size=dist_env.world_size,
        )
    try:
        dist.init_process_group(**kwargs)
    except (RuntimeError, ValueError) as e:
        raise EnvironmentDetectionError(
            f"init_process_group(backend={backend!r}) as rank {dist_env.rank} of {dist_env.world_size} "
            f"with master {dist_env.master_addr}:{dist_env.master_port} (from {dist_env.source}) failed: {e}",
            "check that every rank got the same MASTER_ADDR/MASTER_PORT (`torchhpc env` in each task) "
            "and that rank 0's host is reachable on that port",
        ) from e
