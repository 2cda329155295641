"""matplotlib for every ``--plot`` and report PNG: an optional extra (``torchhpc[plot]``), looked for
and imported only here and only when asked, never at start-up."""

from __future__ import annotations

from types import ModuleType

from torchhpc.errors import UsageError

__all__ = ["check_available", "pyplot"]

_MISSING = (
    "--plot needs matplotlib, which is not installed here",
    "pip install 'torchhpc[plot]' (or matplotlib), or drop --plot and plot the --json later",
)


def check_available() -> None:
    """Fail before the work starts, not after it, when --plot cannot be honoured (finds, never imports)."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise UsageError(*_MISSING)


def pyplot() -> ModuleType:
    """``matplotlib.pyplot`` on the Agg backend; a UsageError where matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display on compute nodes
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError(*_MISSING) from None
    return plt
