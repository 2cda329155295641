"""The opt-in step marker ``torchhpc top`` reads: one line per step in the rank's own output.

``top`` already reads tqdm bars, Lightning's bar and the Hugging Face Trainer's log lines from a
rank's output with no change to the code; a loop with none of them calls
``torchhpc.dist.mark_step(step, total=None, loss=...)``. The marker is a line on stderr (the rank's
own log, whatever the launcher), ``torchhpc-step: {"step": 12, "total": 100, "loss": 0.3}``, at
most one every ``every_s`` seconds (the last step always), so a fast loop does not fill its log.
stdlib only: no torch, nothing to set up.
"""

from __future__ import annotations

import json
import math
import sys
import time
from typing import Any, Optional, TextIO

__all__ = ["mark_step"]

_last = [0.0]  # when the last marker was written (one per process)


def mark_step(step: int, total: Optional[int] = None, *, every_s: float = 1.0, stream: Optional[TextIO] = None,
              **metrics: Any) -> bool:
    """Say this rank reached ``step`` (of ``total``), with numeric ``metrics`` (loss=..., lr=...).

    Returns whether a line was written (False: within ``every_s`` of the last one).
    Non-numeric metrics and NaN/inf are left out: the line stays valid JSON for the parser.
    """
    now = time.monotonic()
    final = total is not None and step >= total
    if not final and now - _last[0] < every_s:
        return False
    _last[0] = now
    record: dict[str, Any] = {"step": int(step)}
    if total is not None:
        record["total"] = int(total)
    for key, value in metrics.items():
        try:
            v = float(value)
        except (TypeError, ValueError):
            continue
        if math.isfinite(v):
            record[key] = v
    out = stream or sys.stderr
    out.write("torchhpc-step: " + json.dumps(record) + "\n")
    out.flush()
    return True
