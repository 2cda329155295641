"""``python -m torchhpc.bench all_reduce -b 1K -e 64M`` is ``torchhpc bench all_reduce ...``.

The module form is what launchers start on every rank (``torchhpc run -m``,
srun, torchrun), so it needs no ``torchhpc`` script on the compute node's PATH,
and no CLI module (see :mod:`torchhpc.bench.command`).
"""

from __future__ import annotations

from torchhpc.bench.command import main

if __name__ == "__main__":
    raise SystemExit(main())
