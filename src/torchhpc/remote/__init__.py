"""``--remote [USER@]HOST``: ship the code over ssh and let the login node's torchhpc do the work.

:mod:`.ship` packs the code (git archive + patch, or a tarball) under a content
digest; :mod:`.ssh` runs the system ssh client through one master connection;
:mod:`.forward` forwards a command line (``forward.forward``) and prints the handle. Stdlib only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torchhpc.remote.route import REMOTE_COMMANDS, extract, target

if TYPE_CHECKING:
    from torchhpc.remote.forward import Request
    from torchhpc.remote.ship import Bundle, collect

__all__ = ["REMOTE_COMMANDS", "Bundle", "Request", "collect", "extract", "target"]


def __getattr__(name: str) -> Any:
    """``Request``, ``Bundle``, ``collect``: loaded on first use, as the CLI asks :mod:`.route` about every
    command line and must not load the shipping machinery for a command that stays here."""
    if name == "Request":
        from torchhpc.remote.forward import Request

        return Request
    if name in ("Bundle", "collect"):
        from torchhpc.remote import ship

        return getattr(ship, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
