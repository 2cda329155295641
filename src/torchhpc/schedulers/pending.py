"""Why a job waits: one category, a summary, one suggested action, and the evidence behind them.

Shared by the backends that can say why a job is pending (slurm/pending.py, pbs/pending.py).
The rule: nothing is guessed. A category comes from the scheduler's own reason or comment; an
action is suggested only when the evidence the scheduler gave supports it, otherwise it is None.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

__all__ = ["CATEGORIES", "Pending"]

# The vocabulary of `status --json`'s pending.category.
CATEGORIES = ("resources", "priority", "dependency", "limit", "held", "reservation", "begin_time", "never", "other")


@dataclass(frozen=True)
class Pending:
    category: str
    summary: str
    action: Optional[str] = None  # None: no evidence supports one
    evidence: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.category not in CATEGORIES:
            raise ValueError(f"unknown pending category {self.category!r}")

    def lines(self) -> list[str]:
        """``pending: SUMMARY``, the action, then the evidence, indented."""
        out = [f"pending: {self.summary}"]
        if self.action:
            out.append(f"  action: {self.action}")
        out += [f"  {e}" for e in self.evidence]
        return out

    def to_json(self) -> dict[str, object]:
        return {"category": self.category, "summary": self.summary, "action": self.action,
                "evidence": list(self.evidence)}
