"""The detector protocol: a name, the variables it reads, and ``probe()``.

Each detector turns "does this look like my launcher?" and "what are the
numbers?" into one :class:`Verdict`. Inconsistent values of a recognised
launcher become a matched verdict with an ``error`` rather than an exception,
so ``explain()`` can show them next to the other detectors' answers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from torchhpc.env.base import DistEnv, Verdict
from torchhpc.env.context import JobContext
from torchhpc.errors import EnvironmentDetectionError

__all__ = ["Detector", "ceil_div"]


def ceil_div(a: int, b: int) -> int:
    return -(-a // max(b, 1))


class Detector:
    """One source of rank information. Subclasses set ``name`` and ``variables`` and implement ``probe``."""

    name: str = ""
    # The variables this detector reads, for --explain and the docs.
    variables: tuple[str, ...] = ()

    def probe(self, env: Mapping[str, str], ctx: JobContext) -> Verdict:
        raise NotImplementedError

    def miss(self, reason: str) -> Verdict:
        return Verdict(self.name, False, reason)

    def hit(self, reason: str, build: Callable[[], DistEnv]) -> Verdict:
        """A matched verdict; a detection error while building becomes the verdict's ``error``."""
        try:
            dist_env = build()
        except EnvironmentDetectionError as e:
            return Verdict(self.name, True, reason, error=e)
        return Verdict(self.name, True, reason, env=dist_env)
