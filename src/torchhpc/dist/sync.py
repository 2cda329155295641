"""Rank coordination for training scripts: prepare-once, metric averaging, seeding.

Every function works in three situations without the caller checking which:
a plain single process (no launcher, no process group: they degrade to no-ops),
a process group started by :func:`torchhpc.dist.init`, or one the user started
with ``torch.distributed.init_process_group`` themselves. That is what lets a
script stay unchanged between ``python train.py`` and ``torchhpc run -n 8``.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import random
import socket
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from torchhpc.errors import TorchHPCError

if TYPE_CHECKING:
    import torch

__all__ = [
    "all_gather_objects",
    "all_reduce_max",
    "all_reduce_mean",
    "all_reduce_sum",
    "average_metrics",
    "barrier",
    "is_distributed",
    "main_first",
    "rank",
    "seed_everything",
    "world_size",
]


def is_distributed() -> bool:
    """True when a default process group is up (and so collectives must be called)."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    """Global rank, 0 without a process group."""
    import torch.distributed as dist

    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    """World size, 1 without a process group."""
    import torch.distributed as dist

    return dist.get_world_size() if is_distributed() else 1


def barrier() -> None:
    """Wait for every rank; a no-op in a single process."""
    import torch.distributed as dist

    if is_distributed():
        dist.barrier()


def all_gather_objects(obj: Any, group: Any = None) -> list[Any]:
    """Every rank's picklable ``obj``, in rank order (``[obj]`` without a process group).

    ``dist.all_gather_object`` without its numpy dependency: torch unpickles the
    received bytes through ``tensor.numpy()``, so a venv with torch but no numpy
    dies there ("Numpy is not available"). Two tensor all-gathers (sizes, then
    padded bytes) on the group's device do the same. For small objects only
    (host names, statuses, RNG states): the bytes come back through ``tolist()``.
    ``group``: the process group to gather over (default: the default group).
    """
    import torch
    import torch.distributed as dist

    if not is_distributed():
        return [obj]
    backend = str(dist.get_backend(group))
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    payload = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8).to(device)
    size = torch.tensor([payload.numel()], dtype=torch.int64, device=device)
    sizes = [torch.zeros_like(size) for _ in range(dist.get_world_size(group))]
    dist.all_gather(sizes, size, group=group)
    longest = max(int(s) for s in sizes)
    padded = torch.zeros(longest, dtype=torch.uint8, device=device)
    padded[: payload.numel()] = payload
    received = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(received, padded, group=group)
    return [pickle.loads(bytes(r[: int(n)].cpu().tolist())) for r, n in zip(received, sizes)]


def _local_first_rank() -> bool:
    """Is this rank the lowest global rank on its host?

    Asked of the ranks themselves (hostname all-gather) rather than of LOCAL_RANK,
    because srun-direct and mpirun set different variables and a wrong guess here
    means two writers of the same cache file or none at all.
    """
    names = all_gather_objects(socket.gethostname())
    return names.index(socket.gethostname()) == rank()


@contextmanager
def main_first(local: bool = False, first: bool | None = None) -> Iterator[bool]:
    """Run the body on rank 0 first, then on every other rank.

    ``with main_first(): data = prepare(cache)`` downloads or renders once per job
    while the other ranks wait, then they read what rank 0 left behind. With
    ``local=True`` the first rank *of each node* goes first (node-local disks);
    ``first`` overrides the choice (e.g. ``ctx.local_rank == 0``).

    The waiting is an all-gather of a status, not a bare barrier: if the first
    rank's body raises, the others raise too (naming the rank and its error)
    instead of hanging until the collective timeout. Yields whether this rank went
    first.
    """
    if not is_distributed():
        yield True
        return
    if first is None:
        first = _local_first_rank() if local else rank() == 0
    if first:
        try:
            yield True
        except BaseException as exc:
            all_gather_objects(f"{type(exc).__name__}: {exc}")
            raise
        all_gather_objects("ok")
        return
    status = all_gather_objects("waiting")
    failed = [(r, s) for r, s in enumerate(status) if s not in ("ok", "waiting")]
    if failed:
        r, why = failed[0]
        raise TorchHPCError(
            f"rank {r} failed while preparing data inside main_first(): {why}",
            hint=f"see rank {r}'s log for the traceback; the other ranks stopped instead of waiting forever",
        )
    yield False


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum across ranks into a new tensor (the input is left as it was)."""
    return _all_reduce(tensor, "SUM")


def all_reduce_max(tensor: torch.Tensor) -> torch.Tensor:
    """Maximum across ranks into a new tensor (e.g. the slowest rank's epoch time)."""
    return _all_reduce(tensor, "MAX")


def _all_reduce(tensor: torch.Tensor, op: str) -> torch.Tensor:
    import torch.distributed as dist

    out = tensor.detach().clone()
    if is_distributed():
        dist.all_reduce(out, op=getattr(dist.ReduceOp, op))
    return out


def all_reduce_mean(tensor: torch.Tensor) -> torch.Tensor:
    """Mean across ranks into a new tensor; integer tensors are averaged as float."""
    out = all_reduce_sum(tensor if tensor.is_floating_point() else tensor.double())
    return out / world_size()


def average_metrics(metrics: Mapping[str, float], weight: float = 1.0, device: Any = None) -> dict[str, float]:
    """Average a dict of scalars across ranks in ONE collective.

    ``weight`` (e.g. the number of samples this rank saw) makes it a weighted
    mean, so ranks with an uneven last batch count correctly. All ranks must
    pass the same keys.
    """
    import torch

    keys = sorted(metrics)
    if not is_distributed():
        return {k: float(metrics[k]) for k in keys}
    dev = device if device is not None else _collective_device()
    buf = torch.tensor([float(metrics[k]) * weight for k in keys] + [float(weight)], dtype=torch.float64, device=dev)
    buf = all_reduce_sum(buf).cpu()
    total = float(buf[-1]) or 1.0
    return {k: float(buf[i]) / total for i, k in enumerate(keys)}


def _collective_device() -> Any:
    """NCCL only reduces CUDA tensors; gloo takes CPU ones."""
    import torch
    import torch.distributed as dist

    if dist.get_backend() == "nccl" and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def seed_everything(seed: int, per_rank: bool = True) -> int:
    """Seed python, numpy (if present) and torch; returns the seed actually used.

    ``per_rank=True`` adds the rank so augmentation and dropout differ between
    ranks (identical noise on every rank wastes the extra data). Model weights
    still start identical under DDP: it broadcasts rank 0's parameters on wrap.
    """
    import torch

    effective = seed + (rank() if per_rank else 0)
    random.seed(effective)
    os.environ.setdefault("PYTHONHASHSEED", str(effective))
    with contextlib.suppress(ImportError):  # numpy is optional
        import numpy as np

        np.random.seed(effective % (2**32))
    torch.manual_seed(effective)
    return effective
