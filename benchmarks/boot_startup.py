"""Does the rank boot directory (src/torchhpc/launchers/boot.py) cost a program that never imports torch?

Pairs, each with the boot and without it (``TORCHHPC_EXIT_CURE=0``), interleaved round by round:

* ``python -c 'import json'`` with the package's boot directory first on PYTHONPATH (the local
  scheduler) against the same without it: the cost of the sitecustomize itself (its finder, the
  chained sitecustomize lookup);
* the same program started through the per-task shim (bash: the boot lines' existence test and
  PYTHONPATH export) against the shim with the switch off;
* ``true`` (not Python) through the shim, on against off.

Prints medians of wall and CPU time, and the ratios of medians on/off per pair. The goal: within noise
(<= 1.05 in CPU time; wall time on a loaded machine is mostly the wait for a core).

    python benchmarks/boot_startup.py [--rounds 30]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from torchhpc.launchers import TASK_SHIM
from torchhpc.launchers.boot import BOOT_DIR, boot_pythonpath

PROGRAM = [sys.executable, "-c", "import json"]


def variants(tmp: str) -> dict[str, tuple[list[str], dict[str, str]]]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHHPC_", "SLURM_", "OMPI_", "PMI_"))}
    base["TMPDIR"] = tmp
    on = {**base, "PYTHONPATH": boot_pythonpath(base) or BOOT_DIR}
    off = {**base, "TORCHHPC_EXIT_CURE": "0"}
    shim = ["bash", "-c", TASK_SHIM, "torchhpc-task"]
    return {
        "python, boot on PYTHONPATH": (PROGRAM, on),
        "python, no boot": (PROGRAM, off),
        "python via shim, boot": ([*shim, *PROGRAM], base),
        "python via shim, off": ([*shim, *PROGRAM], off),
        "true via shim, boot": ([*shim, "true"], base),
        "true via shim, off": ([*shim, "true"], off),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=30)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        vs = variants(tmp)
        for argv, env in vs.values():  # warm-up, and the shim writes its boot directory once
            subprocess.run(argv, env=env, check=True)
        times: dict[str, list[float]] = {k: [] for k in vs}
        cpu: dict[str, list[float]] = {k: [] for k in vs}
        names = list(vs)
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[: r % len(names)]:  # rotate the order each round
                argv, env = vs[name]
                c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                t0 = time.perf_counter()
                subprocess.run(argv, env=env, check=True)
                times[name].append(time.perf_counter() - t0)
                c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu[name].append(c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime)
    # CPU time (user + sys of the started processes) is the figure that survives a loaded machine;
    # wall time also counts the waits for a core.
    med = {k: statistics.median(v) for k, v in times.items()}
    mcpu = {k: statistics.median(v) for k, v in cpu.items()}
    print(f"{'variant':30} {'wall ms':>8} {'min-max':>15} {'cpu ms':>8}")
    for k, v in times.items():
        print(f"{k:30} {med[k] * 1e3:8.1f} {min(v) * 1e3:7.1f}-{max(v) * 1e3:<7.1f} {mcpu[k] * 1e3:8.1f}")
    print()
    for on, off in zip(names[::2], names[1::2]):
        print(f"{on} / {off}: wall {med[on] / med[off]:.3f}, cpu {mcpu[on] / max(mcpu[off], 1e-9):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
