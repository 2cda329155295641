"""Single-file checkpoints ``ckpt-NNNNNNNNN.pt``, as torchhpc wrote them before DCP.

:func:`load` lets :func:`torchhpc.dist.checkpoint.resume` restore them, also into
an FSDP2 model (each rank keeps its shard of the whole tensors). The old writer is
no longer shipped (rank 0 saved its own full state: wrong under FSDP); tests and
``benchmarks/checkpoint_cost.py`` keep a copy (tests/legacy_checkpoint.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["load"]


def _has_dtensor(model: Any) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def _named_optimizer_state(model: Any, optimizer: Any, saved: dict[str, Any]) -> dict[str, Any]:
    """An ``optimizer.state_dict()`` (parameters by position) keyed by parameter name instead, as torch's
    ``set_state_dict`` takes it: the i-th saved id is the i-th parameter of this optimizer's groups."""
    names = {id(p): n for n, p in getattr(model, "module", model).named_parameters()}
    ids_to_name: dict[int, str] = {}
    groups = []
    for mine, theirs in zip(optimizer.param_groups, saved["param_groups"]):
        fqns = [names[id(p)] for p in mine["params"]]
        ids_to_name.update(zip(theirs["params"], fqns))
        groups.append({**theirs, "params": fqns})
    return {"state": {ids_to_name[i]: s for i, s in saved["state"].items()}, "param_groups": groups}


def load(path: Path, model: Any, optimizer: Any, scheduler: Any) -> dict[str, Any]:
    """Restore model, optimizer and scheduler from an old file; returns its payload (step, rng, extra)."""
    import torch

    from torchhpc.dist.checkpoint_state import apply_state

    payload: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=False)
    if model is not None and payload.get("model") is not None:
        if _has_dtensor(model):  # FSDP2: every rank takes its shard of the whole tensors
            state: dict[str, Any] = {"model": payload["model"]}
            if optimizer is not None and payload.get("optimizer") is not None:
                state["optim"] = _named_optimizer_state(model, optimizer, payload["optimizer"])
            apply_state(model, optimizer, state, full=True)
            optimizer = None  # done
        else:
            getattr(model, "module", model).load_state_dict(payload["model"])
    if optimizer is not None and payload.get("optimizer") is not None:
        optimizer.load_state_dict(payload["optimizer"])
    if scheduler is not None and payload.get("scheduler") is not None:
        scheduler.load_state_dict(payload["scheduler"])
    return payload
