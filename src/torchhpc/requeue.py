"""Moved to :mod:`torchhpc.functions.requeue`; kept for one release.

A ``Checkpoint`` pickled by the previous release names this module, and a requeued job unpickles it.
"""

from __future__ import annotations

from torchhpc.functions.requeue import Checkpoint, Stop, checkpointable, stop_parameter

__all__ = ["Checkpoint", "Stop", "checkpointable", "stop_parameter"]
