"""Training-side helpers: ``ctx = torchhpc.dist.init()`` and friends.

torch is imported lazily (inside functions), so ``import torchhpc.dist`` is
cheap and safe on a login node. The helpers in the sibling modules (``wrap``,
``loader``, ``main_first``, ...) are reachable from here too, loaded on
first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from torchhpc.dist.context import DEFAULT_TIMEOUT, DistContext, cleanup, current, init, log0, print0

# name -> sibling module that defines it, imported on first attribute access.
_LAZY = {
    "wrap": "ddp",
    "unwrap": "ddp",
    "default_device": "ddp",
    "loader": "data",
    "TensorLoader": "data",
    "EpochLoader": "data",
    "accumulation": "position",
    "read_ledger": "position",
    "rank": "sync",
    "world_size": "sync",
    "main_first": "sync",
    "barrier": "sync",
    "is_distributed": "sync",
    "all_gather_objects": "sync",
    "all_reduce_sum": "sync",
    "all_reduce_mean": "sync",
    "all_reduce_max": "sync",
    "average_metrics": "sync",
    "seed_everything": "sync",
    "should_stop": "stop",
    "request_stop": "stop",
    "checkpoint": "",
    "mark_step": "progress",
}

__all__ = ["DEFAULT_TIMEOUT", "DistContext", "cleanup", "current", "init", "log0", "print0", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None or name.startswith("__"):
        raise AttributeError(f"module 'torchhpc.dist' has no attribute {name!r}")
    if module == "":  # a submodule, e.g. torchhpc.dist.checkpoint
        value = importlib.import_module(f"torchhpc.dist.{name}")
    else:
        value = getattr(importlib.import_module(f"torchhpc.dist.{module}"), name)
    globals()[name] = value
    return value
