"""``should_stop()``: every rank stops at the same step when the job is about to end.

The batch script (``--signal-before``/``--requeue``) receives the scheduler's
warning and creates ``$TORCHHPC_STOP_FILE``; a SIGTERM that reaches a rank
directly (preemption's grace time, ``scancel --signal=TERM``, torchrun shutting
its workers down) sets the same flag and creates the same file, so the batch
shell knows the ranks stopped for a preemption and requeues the job. Each rank's local answer is combined with one small MAX all_reduce,
so either all ranks checkpoint and leave at this step or none does: a rank
that stops alone would leave the others blocked in the next collective.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Any

__all__ = ["TAKEN", "request_stop", "should_stop", "stop_requested_locally", "taken", "touch_stop_file", "watch"]

# Beside the stop file: a rank took the stop (it checkpoints and leaves). A step that ends 0 after a
# time-limit warning without it had finished its work before the warning reached it: the batch shell
# does not requeue it (run K: a fast resumed attempt ended 60 ms before the warning, was requeued,
# and did its last 34 steps again).
TAKEN = ".taken"

_flag = threading.Event()
_installed = False
_reason = ""


def _on_signal(signum: int, frame: Any) -> None:
    global _reason
    _reason = signal.Signals(signum).name
    _flag.set()
    touch_stop_file()


def touch_stop_file(suffix: str = "") -> None:
    """Tell the other ranks and the batch shell: preemption sends SIGTERM to the ranks only
    (not to the batch shell), so the file is how the shell learns it should requeue."""
    path = os.environ.get("TORCHHPC_STOP_FILE")
    if path:
        # a read-only or missing directory must not turn a stop into a crash
        with contextlib.suppress(OSError), open(path + suffix, "a"):
            pass


def taken() -> None:
    """Say that this rank took the stop (``$TORCHHPC_STOP_FILE.taken``): what ``should_stop()`` does when it
    answers True. A program that polls the stop file by itself does the same before it leaves."""
    touch_stop_file(TAKEN)


def watch(signals: tuple[int, ...] = (signal.SIGTERM,)) -> None:
    """Turn SIGTERM into a stop request instead of death (idempotent; main thread only)."""
    global _installed
    if _installed or threading.current_thread() is not threading.main_thread():
        return
    for s in signals:
        signal.signal(s, _on_signal)
    _installed = True


def request_stop(reason: str = "requested") -> None:
    global _reason
    _reason = reason
    _flag.set()


def stop_requested_locally() -> bool:
    """This rank's view: a stop file exists or a watched signal arrived."""
    path = os.environ.get("TORCHHPC_STOP_FILE")
    return bool(path and os.path.exists(path)) or _flag.is_set()


def should_stop(every: int = 1, step: int | None = None) -> bool:
    """True on every rank, at the same call, once any rank was asked to stop.

    Call it at a step boundary. ``every=N`` with ``step`` only synchronises on
    steps divisible by N (fewer collectives; the stop comes at most N-1 steps later).
    """
    watch()
    if step is not None and every > 1 and step % every:
        return False
    local = stop_requested_locally()
    from torchhpc.dist.sync import _collective_device, all_reduce_max, world_size

    if world_size() == 1:  # also without a process group
        stop = local
    else:
        import torch

        flag = torch.tensor([1 if local else 0], dtype=torch.int32, device=_collective_device())
        stop = bool(all_reduce_max(flag).item())
    if stop:
        taken()
    return stop
