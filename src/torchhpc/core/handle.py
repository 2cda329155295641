"""A job's handle, ``SCHEDULER:ID``: one type, parsed and printed here only.

Every command prints a job as ``local:3f2a9c1b0d`` or ``slurm:123_4`` and takes it back the same way (kubectl's
``TYPE/NAME``, parsed and printed in one place). No scheduler's job id holds a colon (Slurm ``123_4``, PBS
``123.server``, local hex, Kubernetes names), so the first colon splits a handle, and a bare id has none.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torchhpc.errors import UsageError

__all__ = ["Handle", "split_handle"]


def split_handle(text: str) -> tuple[str, str]:
    """``slurm:123`` -> ("slurm", "123"); a bare ``123`` -> ("", "123")."""
    scheduler, sep, job_id = str(text).partition(":")
    return (scheduler, job_id) if sep else ("", scheduler)


@dataclass(frozen=True)
class Handle:
    scheduler: str
    job_id: str

    def __str__(self) -> str:
        return f"{self.scheduler}:{self.job_id}"

    @classmethod
    def parse(cls, text: str, default: str, known: Sequence[str] = ()) -> Handle:
        """A handle; a bare id takes ``default``. A scheduler name outside ``known`` (when given) is a mistyped
        one, said so with the nearest names (``slrum:1``: did you mean slurm:1?)."""
        scheduler, job_id = split_handle(text)
        if scheduler and known and scheduler not in known:
            from torchhpc.core.suggest import closest

            near = closest(scheduler, known, limit=1)
            raise UsageError(
                f"{text}: {scheduler!r} is not a scheduler (known: {', '.join(known)})",
                f"did you mean {cls(near[0], job_id)}?" if near else f"write SCHEDULER:ID, e.g. {cls('slurm', job_id)}",
            )
        return cls(scheduler or default, job_id)
