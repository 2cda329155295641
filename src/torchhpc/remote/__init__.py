"""``--remote [USER@]HOST``: ship the code over ssh and let the login node's torchhpc do the work.

:mod:`.ship` packs the code (git archive + patch, or a tarball) under a content
digest; :mod:`.ssh` runs the system ssh client through one master connection;
:mod:`.forward` forwards a command line (``forward.forward``) and prints the handle. Stdlib only.
"""

from __future__ import annotations

from torchhpc.remote.forward import REMOTE_COMMANDS, Request, extract, target
from torchhpc.remote.ship import Bundle, collect

__all__ = ["REMOTE_COMMANDS", "Bundle", "Request", "collect", "extract", "target"]
