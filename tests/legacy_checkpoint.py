"""The single-file checkpoint writer torchhpc had before DCP (``ckpt-NNNNNNNNN.pt``), for tests and the
benchmark only: :func:`torchhpc.dist.checkpoint.resume` still reads such files
(``torchhpc.dist.checkpoint_legacy.load``), and tests/benchmarks/checkpoint_cost.py compares DCP with this
writer. Rank 0 ``torch.save``\\ s its own full state (wrong under FSDP, where each rank holds a shard: why
the package no longer ships it)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from torchhpc.dist.checkpoint_state import barrier, gather, group, rank_world, rng_state, write_file


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
