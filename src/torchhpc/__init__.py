"""torchhpc: distributed PyTorch on real clusters from one job description.

``import torchhpc`` is cheap and never imports torch: the CLI renders and submits
jobs from login nodes where torch may be absent. Training-side helpers live in
:mod:`torchhpc.dist` and import torch only there.
"""

from __future__ import annotations

__version__ = "0.1.0"

from torchhpc.errors import TorchHPCError

__all__ = ["TorchHPCError", "__version__"]
