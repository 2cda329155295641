"""How many ranks a node's GPUs can hold: the pre-flight arithmetic, stdlib only.

NCCL drives exactly one GPU per rank: two ranks on one GPU fail inside
``init_process_group`` or at the first collective with NCCL's own traceback
from every rank ("Duplicate GPU detected : rank 0 and rank 1 both on CUDA
device"). The check here is plain arithmetic on counts, so the same function
serves ``torchhpc.dist.init()`` (counts seen by the rank, before any process
group exists) and the schedulers (counts requested in a rendered job).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Optional

from torchhpc.core.units import counted
from torchhpc.errors import UsageError

__all__ = ["VISIBLE_VARIABLES", "needs_gpu_per_rank", "ranks_per_gpu_error", "requested_geometry_error", "visible_devices"]

# The variables that narrow what a process sees, in the order CUDA, ROCm and HIP read them.
VISIBLE_VARIABLES = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")


def needs_gpu_per_rank(backend: str) -> bool:
    """True for backends that put one rank on one GPU: ``nccl`` (RCCL on ROCm), also inside ``cpu:gloo,cuda:nccl``."""
    return any(part.split(":")[-1].strip() == "nccl" for part in backend.split(","))


def visible_devices(environ: Mapping[str, str]) -> str:
    """``CUDA_VISIBLE_DEVICES=0,1`` (or the ROCm variable), or ``CUDA_VISIBLE_DEVICES unset``, for messages."""
    for name in VISIBLE_VARIABLES:
        if name in environ:
            return f"{name}={environ[name]}"
    return "CUDA_VISIBLE_DEVICES unset"


def ranks_per_gpu_error(
    local_ranks: int,
    gpus: int,
    *,
    backend: str = "nccl",
    gpus_from: str = "visible",
    visible: Optional[str] = None,
    where: str = "this node",
) -> Optional[UsageError]:
    """The error to raise when ``local_ranks`` ranks of one node would share ``gpus`` GPUs under ``backend``.

    Returns None when the geometry is fine: a backend that does not need a GPU
    per rank (gloo), no GPU at all (that case is the backend choice's to
    refuse), or at least one GPU per rank. ``gpus_from`` says where the count
    comes from ("visible", "requested (--gpus-per-node)"); ``visible`` is the
    visibility variable as text (see :func:`visible_devices`).
    """
    if local_ranks < 1 or gpus < 1 or local_ranks <= gpus or not needs_gpu_per_rank(backend):
        return None
    seen = f" ({visible})" if visible else ""
    message = (
        f"{local_ranks} ranks on {where} with backend 'nccl' but {counted(gpus, 'GPU')} "
        f"{gpus_from}{seen}: NCCL needs one GPU per rank"
    )
    hint = (
        f"start at most {counted(gpus, 'rank')} per node (--nproc-per-node {gpus}), or give each "
        f"rank its own GPU (--gpus-per-node {local_ranks}, and a CUDA_VISIBLE_DEVICES that lists them)"
    )
    return UsageError(message, hint)


def requested_geometry_error(nproc_per_node: int, gpus_per_node: int, env: Mapping[str, str]) -> Optional[UsageError]:
    """The same refusal for a job being rendered: ``--nproc-per-node`` over ``--gpus-per-node`` GPUs.

    Only where GPUs are requested. The ranks' backend is NCCL unless the job's
    environment (``--env``/``-e``) sets ``TORCHHPC_BACKEND`` to one that shares GPUs.
    """
    backend = env.get("TORCHHPC_BACKEND") or "nccl"
    error = ranks_per_gpu_error(nproc_per_node, gpus_per_node, backend=backend,
                                gpus_from="requested (--gpus-per-node)", where="each node")
    if error is not None:
        error.hint = (f"use --nproc-per-node {gpus_per_node} or --gpus-per-node {nproc_per_node}; ranks that do not "
                      "use NCCL may share GPUs: say so with -e TORCHHPC_BACKEND=gloo")
    return error
