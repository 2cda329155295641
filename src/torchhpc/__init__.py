"""torchhpc: distributed PyTorch on real clusters from one job description.

``import torchhpc`` is cheap and never imports torch: the CLI renders and submits
jobs from login nodes where torch may be absent. Training-side helpers live in
:mod:`torchhpc.dist` and import torch only there. ``torchhpc.Executor`` (functions
as jobs) is loaded on first use.
"""

from typing import Any

__version__ = "0.1.0"

from torchhpc.errors import JobFailed, TorchHPCError

# name -> module defining it, imported on first attribute access (keeps ``import torchhpc`` light).
_LAZY = {
    "Executor": "torchhpc.functions.executor",
    "FunctionJob": "torchhpc.functions.executor",
    "Stop": "torchhpc.functions.requeue",
    "Checkpoint": "torchhpc.functions.requeue",
    "checkpointable": "torchhpc.functions.requeue",
    "Job": "torchhpc.job",  # the same object as torchhpc.job.Job (docs/pipelines.md imports it from here)
}

__all__ = ["JobFailed", "TorchHPCError", "__version__", *_LAZY]


def __dir__() -> list[str]:
    """What ``dir(torchhpc)`` shows: the public names, loaded or not (not the module's own machinery)."""
    return sorted(__all__)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'torchhpc' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
