"""The launcher's typed name: :class:`LauncherKind`, the one value a :class:`~torchhpc.core.spec.JobSpec` carries.

Apart from :mod:`torchhpc.core.spec` because it is a vocabulary of its own, read by
``launchers/`` (each :class:`~torchhpc.launchers.Launcher` is keyed by it), by
``env/compat.py`` and by the CLI's ``--launcher`` choices, none of which needs the job
description. It lives in ``core`` and not in ``launchers/`` because the spec, one layer
down, validates the geometry against it.
"""

from __future__ import annotations

from enum import Enum
from typing import Union

from torchhpc.errors import SpecError

__all__ = ["LAUNCHERS", "LauncherKind"]


class LauncherKind(str, Enum):
    """Which launcher starts the ranks: the typed value a :class:`JobSpec` carries.

    A ``str`` enum, so records and job scripts still read ``srun``; the CLI and the
    API take plain strings and convert once, here (:meth:`parse`). What each launcher
    *does* lives in :mod:`torchhpc.launchers` (``get_launcher(spec.launcher)``); the one
    fact stated here is the geometry, because :class:`JobSpec` validates it.
    """

    TORCHRUN = "torchrun"
    SRUN = "srun"
    MPIRUN = "mpirun"

    def __str__(self) -> str:  # f"{kind}" is "srun" on every Python, not "LauncherKind.SRUN"
        return str(self.value)

    @property
    def per_node(self) -> bool:
        """One task per node that forks the node's processes (torchrun), else one task per process."""
        return self is LauncherKind.TORCHRUN

    @classmethod
    def parse(cls, value: Union[str, LauncherKind], source: str = "--launcher") -> LauncherKind:
        try:
            return cls(value)
        except ValueError:
            raise SpecError(
                f"{source} {value!r} is not a launcher", f"choose one of: {', '.join(k.value for k in cls)}"
            ) from None


LAUNCHERS = tuple(k.value for k in LauncherKind)
