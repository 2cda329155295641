"""Moved to :mod:`torchhpc.functions.run`; kept for one release.

Jobs rendered by the previous release run ``python -m torchhpc._fnrun DIR`` (a Slurm requeue runs
the same script again), so this path must still start the rank entry until they are gone.
"""

from __future__ import annotations

import sys

from torchhpc.functions.run import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
