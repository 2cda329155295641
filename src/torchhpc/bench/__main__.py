"""``python -m torchhpc.bench all_reduce -b 1K -e 64M`` is ``torchhpc bench all_reduce ...``.

The module form is what launchers start on every rank (``torchhpc run -m``,
srun, torchrun), so it needs no ``torchhpc`` script on the compute node's PATH.
"""

from __future__ import annotations

import sys

from torchhpc.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main(["bench", *sys.argv[1:]]))
