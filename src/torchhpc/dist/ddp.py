"""Wrapping a model for data-parallel training: DDP (any backend) or FSDP (CUDA).

``wrap(model)`` is the one line a script adds: it moves the model to this rank's
device, wraps it in ``DistributedDataParallel`` with the right ``device_ids``
(the classic multi-GPU bug is every rank landing on GPU 0) and returns the model
untouched in a plain single process, so the same script runs without a launcher.

Defaults chosen from measurements on CPU/gloo (benchmarks/training_table.py, F6):
``gradient_as_bucket_view=True`` saves one gradient copy per step and never hurts;
bucket size and ``static_graph`` are exposed because their best values depend on
the model and the fabric.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torchhpc.dist.sync import is_distributed
from torchhpc.errors import UsageError

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = ["STRATEGIES", "default_device", "unwrap", "wrap"]

STRATEGIES = ("ddp", "fsdp")
_COMPRESSION = ("fp16", "bf16")


def default_device() -> torch.device:
    """The device this rank should train on: its current CUDA device, else CPU.

    ``torchhpc.dist.init`` sets the current CUDA device from the local rank; a
    user who started the process group by hand should call
    ``torch.cuda.set_device(local_rank)`` first, as with plain DDP.
    """
    import torch

    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def wrap(
    model: nn.Module,
    *,
    device: Any = None,
    strategy: str = "ddp",
    bucket_cap_mb: float | None = None,
    gradient_as_bucket_view: bool = True,
    static_graph: bool = False,
    find_unused_parameters: bool = False,
    compression: str | None = None,
    **kwargs: Any,
) -> nn.Module:
    """Move ``model`` to ``device`` and wrap it for data-parallel training.

    Without a process group the model is only moved (single-process runs stay
    plain). ``strategy="fsdp"`` shards parameters with FSDP (CUDA only: it is
    pointless on CPU and unsupported on gloo). ``compression`` ("fp16"/"bf16")
    registers PyTorch's gradient-compression communication hook, halving the
    bytes all-reduced per step. Extra keyword arguments go to DDP/FSDP.
    """
    import torch

    if strategy not in STRATEGIES:
        raise UsageError(f"strategy={strategy!r} is not one of {', '.join(STRATEGIES)}", hint="use 'ddp' unless the model does not fit on one GPU")
    if compression is not None and compression not in _COMPRESSION:
        raise UsageError(f"compression={compression!r} is not one of {', '.join(_COMPRESSION)}", hint="leave it out for full-precision gradients")
    dev = torch.device(device) if device is not None else default_device()
    model = model.to(dev)
    if not is_distributed():
        return model
    if strategy == "fsdp":
        return _wrap_fsdp(model, dev, **kwargs)

    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp_kwargs: dict[str, Any] = {
        "gradient_as_bucket_view": gradient_as_bucket_view,
        "static_graph": static_graph,
        "find_unused_parameters": find_unused_parameters,
    }
    if bucket_cap_mb is not None:
        ddp_kwargs["bucket_cap_mb"] = bucket_cap_mb
    ddp_kwargs.update(kwargs)
    if dev.type == "cuda":
        # One device per process: DDP must be told which, or it replicates onto GPU 0.
        ddp_kwargs.setdefault("device_ids", [dev.index if dev.index is not None else torch.cuda.current_device()])
        ddp_kwargs.setdefault("output_device", ddp_kwargs["device_ids"][0])
    wrapped = DDP(model, **ddp_kwargs)
    if compression is not None:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        hook = default_hooks.fp16_compress_hook if compression == "fp16" else default_hooks.bf16_compress_hook
        wrapped.register_comm_hook(None, hook)
    return wrapped


def _wrap_fsdp(model: nn.Module, dev: torch.device, **kwargs: Any) -> nn.Module:
    if dev.type != "cuda":
        raise UsageError(
            f"strategy='fsdp' needs CUDA, but this rank trains on {dev}",
            hint="use strategy='ddp' on CPU (FSDP only pays off when a model does not fit in one GPU's memory)",
        )
    try:  # FSDP2 (torch >= 2.6): shard each top-level child, then the root.
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # pragma: no cover - older torch
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        return FSDP(model, device_id=dev, **kwargs)
    for child in model.children():
        if any(p.requires_grad for p in child.parameters()):
            fully_shard(child, **kwargs)
    fully_shard(model, **kwargs)
    return model


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module inside a DDP/DataParallel wrapper (for saving state dicts)."""
    inner = getattr(model, "module", None)
    return inner if inner is not None and type(model).__name__ in ("DistributedDataParallel", "DataParallel") else model
