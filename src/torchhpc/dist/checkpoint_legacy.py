"""Single-file checkpoints ``ckpt-NNNNNNNNN.pt``, as torchhpc wrote them before DCP.

:func:`load` lets :func:`torchhpc.dist.checkpoint.resume` restore them, also into
an FSDP2 model (each rank keeps its shard of the whole tensors). :func:`save` is
the old writer, kept for the benchmark that compares it with DCP
(``benchmarks/checkpoint_cost.py``) and for tests that make an old checkpoint:
rank 0 gathers nothing but RNG states and ``torch.save``\\ s its own full state,
which is wrong under FSDP (each rank holds a shard) and why it is no longer used.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from torchhpc.dist.checkpoint_state import barrier, gather, group, rank_world, rng_state, write_file

__all__ = ["load", "save"]


def _plain(obj: Any) -> Any:
    return None if obj is None else getattr(obj, "module", obj).state_dict()


def save(directory: str | os.PathLike[str], *, step: int, model: Any = None, optimizer: Any = None,
         scheduler: Any = None, **extra: Any) -> Path | None:
    """The old helper's write: rank 0's full state in one file, renamed into place; all ranks call it."""
    pg = group()
    rngs = gather(rng_state(), pg)
    rank, world = rank_world()
    path: Path | None = None
    if rank == 0:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        payload = {"step": step, "world_size": world, "model": _plain(model), "optimizer": _plain(optimizer),
                   "scheduler": _plain(scheduler), "rng": rngs, "extra": extra}
        path = d / f"ckpt-{step:09d}.pt"
        tmp = d / f".{path.name}.tmp-{os.getpid()}"
        write_file(tmp, payload)
        os.replace(tmp, path)
    barrier(pg)
    return path


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
