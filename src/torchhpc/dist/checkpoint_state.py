"""The torch side of :mod:`torchhpc.dist.checkpoint`: state dicts, DCP writes and reads, RNG, the group.

Kept apart so that the checkpoint module reads as the protocol (names, temporary
directory, publish, keep) and this one as the calls into torch. torch is imported
inside functions only.

* The state is ``{"model": ..., "optim": ...}`` from torch's
  ``get_state_dict``: fully qualified names whatever the wrapper (DDP's
  ``module.`` prefix dropped, FSDP2's DTensor shards as they are), so a checkpoint
  of a DDP run loads into a plain model and one of 4 FSDP ranks into 2 or 3.
* Writes go through one ``FileSystemWriter`` per checkpoint (each rank its own
  file, fsynced; ``.metadata`` last, by rank 0, after every rank reported).
* Async staging keeps one set of host buffers for the life of the process
  (DCP's ``DefaultStager`` caches them by the source storage): the pause is a
  copy into memory already there, and host memory stays flat over many saves.
  torch 2.11's stager closes itself after each copy (found on an H200: the
  second async save failed with ``KeyError: <class 'type'>``); there a spent
  stager is replaced, and each save allocates its buffers anew.
"""

from __future__ import annotations

import contextlib
import os
import random
from pathlib import Path
from typing import Any

__all__ = [
    "agree",
    "apply_state",
    "barrier",
    "gather",
    "group",
    "rank_world",
    "read",
    "rng_state",
    "set_rng_state",
    "share",
    "stager",
    "state_of",
    "write",
    "write_async",
    "write_file",
]


def rank_world() -> tuple[int, int]:
    from torchhpc.dist.sync import rank, world_size

    return rank(), world_size()


def group() -> Any:
    """The checkpoint's own gloo group (:func:`torchhpc.dist.context.checkpoint_group`), None alone."""
    from torchhpc.dist.context import checkpoint_group

    return checkpoint_group()


def gather(obj: Any, pg: Any) -> list[Any]:
    """Every rank's small picklable ``obj`` in rank order, over ``pg`` (``[obj]`` alone)."""
    if pg is None:
        return [obj]
    from torchhpc.dist.sync import all_gather_objects

    return all_gather_objects(obj, group=pg)  # not dist.all_gather_object: it needs numpy


def agree(ok: bool, pg: Any) -> bool:
    """True only where every rank says ``ok`` (so that all ranks skip a bad checkpoint together)."""
    if pg is None:
        return ok
    import torch
    import torch.distributed as dist

    flag = torch.tensor([1 if ok else 0], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=pg)
    return bool(flag.item())


def barrier(pg: Any) -> None:
    if pg is not None:
        import torch.distributed as dist

        dist.barrier(group=pg)


def rng_state() -> dict[str, Any]:
    import torch

    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    with contextlib.suppress(ImportError):
        import numpy as np

        state["numpy"] = np.random.get_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import torch

    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        with contextlib.suppress(ImportError):  # saved where numpy was, resumed where it is not
            import numpy as np

            np.random.set_state(state["numpy"])


def state_of(model: Any, optimizer: Any) -> dict[str, Any]:
    """``{"model": ..., "optim": ...}`` (either may be absent): views of the live tensors, sharded as trained."""
    if model is None:
        return {}
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    if optimizer is None:
        return {"model": get_model_state_dict(model)}
    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {"model": model_sd, "optim": optim_sd}


def apply_state(model: Any, optimizer: Any, state: dict[str, Any], *, full: bool = False) -> None:
    """Load ``state`` (as :func:`state_of` gives it) into the model and optimizer. ``full``: the tensors are
    whole (an old single-file checkpoint), each rank keeps its own part of them."""
    if model is None:
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_state_dict

    options = StateDictOptions(full_state_dict=full)
    if optimizer is None or "optim" not in state:
        set_model_state_dict(model, state["model"], options=options)
    else:
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                       options=options)


def _quiet_alone(pg: Any) -> None:
    """Without a process group DCP warns on every save and load that it assumes one process (as meant
    here); the warning would repeat at each checkpoint of a plain ``python train.py``."""
    if pg is None:
        import warnings

        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")


def _writer(path: Path, pg: Any) -> Any:
    from torch.distributed.checkpoint import FileSystemWriter

    _quiet_alone(pg)
    return FileSystemWriter(str(path), sync_files=True)


def write(state: dict[str, Any], path: Path, pg: Any) -> None:
    """Every rank writes its part; returns once every rank's write and DCP's ``.metadata`` are done."""
    import torch.distributed.checkpoint as dcp

    dcp.save(state, storage_writer=_writer(path, pg), process_group=pg, no_dist=pg is None)


def share(state: Any, rank: int, world: int) -> Any:
    """``state`` less the whole (non-DTensor) tensors that other ranks write.

    DCP takes a whole tensor that every rank holds (DDP's parameters, Adam's moments of a
    plain model) as replicated and writes it once; but an async save would first copy all of
    them to host memory on every rank. Dealt out here by size (largest first, to the rank
    with the least so far; the same on every rank, since the shapes are), each rank copies
    and writes only its share: the pause and the host buffers shrink by the world size.
    DTensors (FSDP2's shards), other tensor subclasses and other values stay on every rank,
    as DCP expects them.
    """
    import torch

    whole: list[tuple[tuple[Any, ...], int]] = []

    def walk(node: Any, where: tuple[Any, ...]) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, (*where, k))
        elif type(node) in (torch.Tensor, torch.nn.Parameter):  # not DTensor, ShardedTensor or other subclasses
            whole.append((where, node.numel() * node.element_size()))

    walk(state, ())
    load, owner = [0] * world, {}
    for where, size in sorted(whole, key=lambda w: (-w[1], repr(w[0]))):
        r = load.index(min(load))
        load[r] += size
        owner[where] = r

    def keep(node: Any, where: tuple[Any, ...]) -> Any:
        if not isinstance(node, dict):
            return node
        return {k: keep(v, (*where, k)) for k, v in node.items() if owner.get((*where, k), rank) == rank}

    return keep(state, ())


def stager(current: Any) -> Any:
    """DCP's stager for the next async save: ``current`` (its host buffers reused) unless there is none yet or
    it closed itself (:func:`_spent`). Staged on the caller's thread (the copy is the pause; training must not
    step before it ends), pinned and non-blocking where there is a GPU; never shared memory (one process writes)."""
    if current is not None and not _spent(current):
        return current
    import torch
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    cuda = torch.cuda.is_available()
    return DefaultStager(StagingOptions(use_pinned_memory=cuda, use_shared_memory=False,
                                        use_async_staging=False, use_non_blocking_copy=cuda))


def write_async(state: dict[str, Any], path: Path, pg: Any, async_stager: Any) -> Any:
    """Copy this rank's share of ``state`` to host buffers now (the pause, through ``async_stager``), write it on
    a thread; a Future of the write's end."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    if pg is not None and dist.get_world_size(pg) > 1:
        state = share(state, dist.get_rank(pg), dist.get_world_size(pg))
    return dcp.async_save(state, storage_writer=_writer(path, pg), process_group=pg, async_stager=async_stager,
                          no_dist=pg is None)


def _spent(stager: Any) -> bool:
    """Whether DCP's stager closed itself: torch 2.11's ``DefaultStager._stage`` ends with its inner
    ``StateDictStager.close()``, which empties the copy's dispatch table; a second stage through it then
    fails. Later torch keeps it open for the next save (and its host buffers)."""
    inner = getattr(stager, "_state_dict_stager", None)
    return inner is not None and not getattr(inner, "_deepcopy_dispatch", True)


def read(state: dict[str, Any], path: Path, pg: Any) -> None:
    """Fill ``state``'s tensors in place from the checkpoint at ``path``, resharded to this world."""
    import torch.distributed.checkpoint as dcp

    _quiet_alone(pg)
    dcp.load(state, checkpoint_id=str(path), process_group=pg, no_dist=pg is None)


def write_file(path: Path, payload: Any) -> None:
    """``torch.save`` to ``path`` and fsync it (the caller renames the directory that holds it)."""
    import torch

    with open(path, "wb") as f:
        torch.save(payload, f)
        f.flush()
        os.fsync(f.fileno())
