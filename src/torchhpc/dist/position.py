"""Where the data of an epoch stands for the whole job, so a resume on another world size goes on exactly.

Both loaders of :mod:`torchhpc.dist.data` deal one epoch's permutation (it depends only on the seed and
the epoch) to the ranks by stride, DistributedSampler's layout: rank r takes ``order[r::W]``. After every
rank has taken k batches of B, the samples handed out are exactly the prefix ``order[:k*B*W]``. So a
position is two numbers that mean the same thing on any world size: the epoch, and how many samples of its
permutation the job has consumed. A resume on W' ranks deals the rest, ``order[consumed:]``, by stride to
the W' ranks that are left: each sample of an epoch is seen once (torchtitan#811 and Megatron-Bridge#5637
lost or repeated samples because a position was kept per rank).

The ledger (``TORCHHPC_DATA_LEDGER=FILE``, or ``ledger=`` on a loader) is the proof: every rank appends one
JSON line per batch (the indices it was handed, and the position after it) to ``FILE.<restart>.<rank>``,
and one line when it resumes; :func:`read_ledger` drops what a failed attempt handed out after the
checkpoint the next attempt resumed from, and counts what the job really consumed.

:func:`accumulation` keeps the optimizer's global batch when the world changes: on 6 ranks of 2 a step
of 24 samples is 2 micro-batches per rank; on 4 ranks, 3.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Optional

from torchhpc.errors import UsageError

__all__ = ["LEDGER_ENV", "Ledger", "Position", "accumulation", "read_ledger"]

LEDGER_ENV = "TORCHHPC_DATA_LEDGER"


class Position:
    """One loader's place: the epoch being dealt (or next), and the samples of it the job has consumed."""

    def __init__(self, epoch: int = 0, consumed: int = 0) -> None:
        self.epoch, self.consumed = epoch, consumed

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "consumed": self.consumed}

    def load(self, state: dict[str, Any]) -> None:
        try:
            self.epoch, self.consumed = int(state["epoch"]), int(state["consumed"])
        except (KeyError, TypeError, ValueError):
            raise UsageError(f"not a loader position: {state!r}",
                             "pass what the loader's state_dict() returned (checkpoint.resume does it)") from None


def accumulation(global_batch: int, micro_batch: int, world_size: Optional[int] = None) -> int:
    """Micro-batches per rank per optimizer step, so that ``micro_batch * world_size * steps == global_batch``
    on whatever world the job now runs; a global batch the world cannot make is refused at the start."""
    if world_size is None:
        from torchhpc.dist.sync import world_size as current

        world_size = current()
    per_step = micro_batch * world_size
    if global_batch < 1 or micro_batch < 1 or global_batch % per_step:
        raise UsageError(
            f"a global batch of {global_batch} cannot be made of micro-batches of {micro_batch} on {world_size} ranks "
            f"({per_step} samples a micro-step)",
            f"pick a global batch that every world you may run on divides: a multiple of {micro_batch} x the ranks "
            "(with --min-nodes, of both world sizes)",
        )
    return global_batch // per_step


class Ledger:
    """This rank's ledger file, appended one line per batch (None path: off)."""

    def __init__(self, path: Optional[str], rank: int, world_size: int) -> None:
        path = path or os.environ.get(LEDGER_ENV) or None
        self.rank, self.world_size = rank, world_size
        restart = os.environ.get("TORCHHPC_RESTART_COUNT", "0")
        self.file = Path(f"{path}.{restart}.{rank}") if path else None

    def _write(self, record: dict[str, Any]) -> None:
        if self.file is None:
            return
        self.file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.file, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, separators=(",", ":")) + "\n")

    def batch(self, epoch: int, indices: Sequence[int], position: int) -> None:
        self._write({"epoch": epoch, "rank": self.rank, "world": self.world_size, "indices": list(indices),
                     "position": position})

    def resumed(self, epoch: int, consumed: int) -> None:
        self._write({"resume": [epoch, consumed], "rank": self.rank, "world": self.world_size})


def read_ledger(path: str | os.PathLike[str]) -> dict[int, Counter[int]]:
    """epoch -> how many times each sample index was consumed by the job, from every rank's ledger file.

    Attempts are read in restart order; where an attempt resumed from ``(epoch, consumed)``, the batches an
    earlier attempt handed out past that position are dropped (they were lost with it, and dealt again)."""
    base = Path(path)
    attempts: dict[int, list[dict[str, Any]]] = {}
    for f in base.parent.glob(base.name + ".*.*"):
        count = f.name[len(base.name) + 1:].split(".")[0]
        if count.isdigit():
            attempts.setdefault(int(count), []).extend(_lines(f))
    kept: list[dict[str, Any]] = []
    for restart in sorted(attempts):
        records = attempts[restart]
        resumes = [tuple(r["resume"]) for r in records if "resume" in r]
        if resumes:
            at = min(resumes)
            kept = [r for r in kept if (r["epoch"], r["position"]) <= at]
        elif kept:  # a later attempt that resumed nothing started over: what came before was lost
            kept = []
        kept.extend(r for r in records if "resume" not in r)
    out: dict[int, Counter[int]] = {}
    for r in kept:
        out.setdefault(int(r["epoch"]), Counter()).update(int(i) for i in r["indices"])
    return out


def _lines(f: Path) -> Iterable[dict[str, Any]]:
    with open(f, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                yield json.loads(line)
