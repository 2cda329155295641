"""``python -m torchhpc ARGS`` as a user types it, for the tests that run the CLI as a process.

One helper instead of a copy per module: the integration modules drive the dev cluster this way
(its client environment), with output captured as text.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["torchhpc"]


def torchhpc(env: Mapping[str, str] | Any, *args: str, cwd: Path | str | None = None,
             timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run the CLI with ``args`` in ``cwd``; ``env``: an environment, or a dev cluster (its client
    environment, ``client_env()``). ``timeout`` bounds a hang, not the test's pace."""
    environ = dict(env) if isinstance(env, Mapping) else env.client_env()
    return subprocess.run([sys.executable, "-m", "torchhpc", *args], env=environ, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)
