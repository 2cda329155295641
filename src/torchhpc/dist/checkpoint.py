"""Preemption-safe checkpoints: atomic, complete, resumable bit for bit.

``save`` writes on rank 0 to a temporary file in the same directory, fsyncs
it, renames it into place and fsyncs the directory: a kill at any moment
leaves either the old checkpoint or the new one, never a torn file. The last
``keep`` checkpoints stay. Every rank's RNG states are gathered, so a resumed
run draws the same random numbers as an uninterrupted one.

    state = checkpoint.resume(ckpt_dir, model=model, optimizer=opt)   # {} on a fresh start
    step = state.get("step", 0)
    ...
    checkpoint.save(ckpt_dir, step=step, model=model, optimizer=opt, epoch=epoch)
"""

from __future__ import annotations

import os
import random
import re
from pathlib import Path
from typing import Any

__all__ = ["latest", "list_checkpoints", "resume", "save"]

_NAME = re.compile(r"^ckpt-(\d{9})\.pt$")


def _rank_world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _rng_state() -> dict[str, Any]:
    import torch

    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy as np

        state["numpy"] = np.random.get_state()
    except ImportError:
        pass
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    import torch

    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy as np

        np.random.set_state(state["numpy"])


def _gather_rng() -> list[dict[str, Any]]:
    from torchhpc.dist.sync import all_gather_objects

    mine = _rng_state()
    _, world = _rank_world()
    if world == 1:
        return [mine]
    return all_gather_objects(mine)  # not dist.all_gather_object: it needs numpy


def list_checkpoints(directory: str | os.PathLike[str]) -> list[Path]:
    d = Path(directory)
    if not d.is_dir():
        return []
    return sorted(p for p in d.iterdir() if _NAME.match(p.name))


def latest(directory: str | os.PathLike[str]) -> Path | None:
    ckpts = list_checkpoints(directory)
    return ckpts[-1] if ckpts else None


def _state_of(obj: Any) -> Any:
    if obj is None:
        return None
    inner = getattr(obj, "module", obj)  # DDP-wrapped models save as plain ones
    return inner.state_dict()


def save(
    directory: str | os.PathLike[str],
    *,
    step: int,
    model: Any = None,
    optimizer: Any = None,
    scheduler: Any = None,
    keep: int = 3,
    **extra: Any,
) -> Path | None:
    """Write checkpoint ``step`` atomically from rank 0; all ranks must call it (RNG gather)."""
    import torch

    rngs = _gather_rng()
    rank, world = _rank_world()
    path: Path | None = None
    if rank == 0:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        payload = {
            "step": step,
            "world_size": world,
            "model": _state_of(model),
            "optimizer": _state_of(optimizer),
            "scheduler": _state_of(scheduler),
            "rng": rngs,
            "extra": extra,
        }
        path = d / f"ckpt-{step:09d}.pt"
        tmp = d / f".{path.name}.tmp-{os.getpid()}"
        with open(tmp, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        _tell_supervisor(step, path)
        for old in list_checkpoints(d)[:-keep] if keep > 0 else []:
            old.unlink(missing_ok=True)
        for stale in d.glob(".ckpt-*.tmp-*"):
            if stale != tmp:
                stale.unlink(missing_ok=True)
    import torch.distributed as dist

    if world > 1 and dist.is_initialized():
        dist.barrier()
    return path


def _tell_supervisor(step: int, path: Path) -> None:
    """``<job dir>/checkpoint.json``: the newest step, for the supervisor's no-progress stop
    (torchhpc.supervisor.progress). Only inside a torchhpc job; a courtesy that never fails a save."""
    import json
    import time

    job_dir = os.environ.get("TORCHHPC_JOB_DIR") or os.path.dirname(os.environ.get("TORCHHPC_RANKS_DIR", "").rstrip("/"))
    if not job_dir or not os.path.isdir(job_dir):
        return
    marker = os.path.join(job_dir, "checkpoint.json")
    tmp = f"{marker}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as f:
            json.dump({"step": step, "path": str(path), "time": time.time()}, f)
        os.replace(tmp, marker)
    except OSError:
        pass


def resume(
    directory: str | os.PathLike[str],
    *,
    model: Any = None,
    optimizer: Any = None,
    scheduler: Any = None,
) -> dict[str, Any]:
    """Restore the newest complete checkpoint; ``{}`` when there is none.

    Returns ``{"step": ..., **extra}``. A checkpoint that fails to load (a
    file damaged outside our control) is skipped for the one before it.
    """
    import torch

    rank, world = _rank_world()
    for path in reversed(list_checkpoints(directory)):
        try:
            payload = torch.load(path, map_location="cpu", weights_only=False)
        except Exception:
            continue
        if model is not None and payload.get("model") is not None:
            getattr(model, "module", model).load_state_dict(payload["model"])
        if optimizer is not None and payload.get("optimizer") is not None:
            optimizer.load_state_dict(payload["optimizer"])
        if scheduler is not None and payload.get("scheduler") is not None:
            scheduler.load_state_dict(payload["scheduler"])
        rngs = payload.get("rng") or []
        if rngs and payload.get("world_size") == world:
            _set_rng_state(rngs[rank])
        elif rngs:
            _set_rng_state(rngs[0])
        return {"step": payload["step"], "path": str(path), **payload.get("extra", {})}
    return {}
