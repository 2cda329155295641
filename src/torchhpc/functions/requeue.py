"""Checkpoint and requeue for functions: ``torchhpc.Stop`` and ``torchhpc.Checkpoint``.

A submitted function that takes a parameter annotated ``torchhpc.Stop`` gets
the nothing-lost protocol of program jobs without writing any of it::

    def train(lr: float, stop: torchhpc.Stop) -> float:
        state = stop.state or {"step": 0, "model": init_model()}   # None on the first attempt
        for step in range(state["step"], STEPS):
            ...
            if stop(step=step):                       # every rank agrees (should_stop)
                return stop.checkpoint({"step": step + 1, ...})
        return final_loss

When the scheduler warns of the time limit (or a preemption's SIGTERM arrives)
``stop()`` turns True on every rank at the same step; the function returns a
checkpoint; the runner keeps each rank's checkpoint in the function directory
and exits 0; the batch script requeues the job; the next attempt calls the
function again with ``stop.state`` set to that rank's checkpoint. Nothing here
imports torch until ``stop()`` is called inside a rank.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Optional

__all__ = ["Checkpoint", "Stop", "checkpointable", "stop_parameter"]


@dataclass(frozen=True)
class Checkpoint:
    """What a function returns to be called again from ``state`` after the requeue."""

    state: Any


class Stop:
    """Handed to a checkpointable function: the previous attempt's state and the stop question."""

    def __init__(self, state: Any = None, restarts: int = 0) -> None:
        self.state = state
        self.restarts = restarts

    @property
    def resumed(self) -> bool:
        return self.state is not None

    def __call__(self, step: Optional[int] = None, every: int = 1) -> bool:
        """True on every rank at the same call once the job was asked to stop (see dist.stop.should_stop)."""
        from torchhpc.dist.stop import should_stop

        return should_stop(every=every, step=step)

    requested = __call__

    def checkpoint(self, state: Any) -> Checkpoint:
        """Wrap ``state`` to be returned: the job requeues and ``stop.state`` is this next time."""
        return Checkpoint(state)

    def __repr__(self) -> str:
        return f"Stop(resumed={self.resumed}, restarts={self.restarts})"


def stop_parameter(fn: Callable[..., Any]) -> Optional[str]:
    """The name of ``fn``'s parameter annotated ``Stop`` (``torchhpc.Stop``, or the string under
    ``from __future__ import annotations``), or the one named by ``fn.__torchhpc_stop__``; else None."""
    marked = getattr(fn, "__torchhpc_stop__", None)
    if isinstance(marked, str):
        return marked
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    for p in params:
        ann = p.annotation
        if ann is Stop or (isinstance(ann, str) and ann.strip("'\" ").split(".")[-1] == "Stop"):
            return p.name
    return None


def checkpointable(param: str = "stop") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Mark a function whose parameter ``param`` receives the :class:`Stop` (when it is not annotated)."""

    def mark(fn: Callable[..., Any]) -> Callable[..., Any]:
        fn.__torchhpc_stop__ = param  # type: ignore[attr-defined]
        return fn

    return mark
