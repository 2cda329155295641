"""Flight Recorder dumps: whose collective sequence is behind.

torch's Flight Recorder keeps the last N collectives of every rank (``TORCH_FR_BUFFER_SIZE``, legacy
``TORCH_NCCL_TRACE_BUFFER_SIZE``) and, with ``TORCH_NCCL_DUMP_ON_TIMEOUT=1``, writes them when a
collective times out to ``$TORCH_FR_DUMP_TEMP_FILE<rank>`` (legacy ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``)
as a pickled dict: ``version``, ``pg_config``, ``pg_status`` (per process group
``last_enqueued_collective``, ``last_started_collective``, ``last_completed_collective``) and
``entries`` (``collective_seq_id``, ``profiling_name``, ``state``, ``pg_id``, ...).

In a hang, the ranks waiting in a collective have enqueued it; the culprit has not: its
``last_enqueued_collective`` is behind theirs. The dumps are read with a restricted unpickler that
builds only plain containers and scalars (a dump file must never run code). torch ships the full
analyser as ``torch.distributed.flight_recorder`` (``torchfrtrace``).
"""

from __future__ import annotations

import io
import os
import pickle
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["FlightVerdict", "behind", "load_dumps", "read_dump"]

_SAFE = {("builtins", n) for n in ("dict", "list", "tuple", "set", "frozenset", "str", "bytes", "int", "float",
                                   "bool", "NoneType")}


class _Plain(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _SAFE:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"a Flight Recorder dump holds no {module}.{name}: refused")


def read_dump(data: bytes) -> dict[str, Any]:
    """One rank's dump, built of plain values only (pickle.UnpicklingError otherwise)."""
    out = _Plain(io.BytesIO(data)).load()
    if not isinstance(out, dict):
        raise pickle.UnpicklingError("a Flight Recorder dump is a dict")
    return out


def load_dumps(directory: str, prefix: str = "") -> dict[int, dict[str, Any]]:
    """rank -> dump for every ``<prefix><rank>`` file in ``directory`` that reads."""
    found: dict[int, dict[str, Any]] = {}
    for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
        m = re.fullmatch(re.escape(prefix) + r"(\d+)", name)
        if not m:
            continue
        try:
            with open(os.path.join(directory, name), "rb") as f:
                found[int(m.group(1))] = read_dump(f.read())
        except (OSError, pickle.UnpicklingError, EOFError, ValueError):
            continue
    return found


@dataclass(frozen=True)
class FlightVerdict:
    pg: str
    behind: tuple[int, ...]  # ranks whose sequence is behind the others'
    seq: Mapping[int, int]  # rank -> last enqueued collective in that group
    waiting_in: str  # the collective the others entered (profiling name)

    def lines(self) -> list[str]:
        if not self.behind:
            return [f"flight recorder: every rank of process group {self.pg} reached collective "
                    f"{max(self.seq.values(), default=0)}"]
        top = max(self.seq.values())
        return [f"flight recorder: rank(s) {', '.join(map(str, self.behind))} of process group {self.pg} are behind: "
                + ", ".join(f"rank {r} at collective {self.seq[r]}" for r in self.behind)
                + f"; the others reached {top}" + (f" ({self.waiting_in})" if self.waiting_in else "")]


def behind(dumps: Mapping[int, Mapping[str, Any]]) -> list[FlightVerdict]:
    """Per process group, the ranks whose last enqueued collective is behind the furthest rank's."""
    groups: dict[str, dict[int, int]] = {}
    for rank, d in dumps.items():
        for pg, st in (d.get("pg_status") or {}).items():
            if isinstance(st, Mapping):
                groups.setdefault(str(pg), {})[rank] = int(st.get("last_enqueued_collective", -1))
    out = []
    for pg, seq in sorted(groups.items()):
        top = max(seq.values())
        late = tuple(sorted(r for r, s in seq.items() if s < top))
        name = ""
        for rank, d in dumps.items():
            if seq.get(rank) == top:
                name = next((str(e.get("profiling_name", "")) for e in d.get("entries", ())
                             if str(e.get("pg_id")) == pg and e.get("collective_seq_id") == top), "")
                if name:
                    break
        out.append(FlightVerdict(pg, late, seq, name))
    return out
