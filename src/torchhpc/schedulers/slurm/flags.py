"""sbatch's and salloc's own flags, as torchhpc spells them: the hint for a Slurm user's habit.

A Slurm user types ``-p gpu``, ``-J name`` or ``--exclusive`` to ``torchhpc run``; a generic "unknown flag"
(or a "did you mean --exclude?" for ``--exclusive``) does not say that torchhpc has the same thing under
another name. Each flag here names its torchhpc form; the ``--opt`` keys come from the backend's own
option table (``torchhpc options slurm``), whose help names the sbatch flag each one sets.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Optional

from torchhpc.schedulers.options import Option

__all__ = ["SPELLED", "native_flag"]

# sbatch flag -> torchhpc's (flags of `run`; the rest are --opt keys, found in SlurmScheduler.OPTIONS)
SPELLED = {
    "-J": "--name NAME", "--job-name": "--name NAME", "-p": "--partition NAME", "-A": "--account NAME",
    "-t": "--time HH:MM:SS", "-N": "--nodes N", "-n": "--ntasks N", "-c": "--cpus-per-proc N",
    "--cpus-per-task": "--cpus-per-proc N",
    "-x": "--exclude NODES", "-w": "--opt nodelist=NODES", "-C": "--opt constraint=FEATURES",
    "--gpus": "--gpus-per-node N", "--gres": "--gpus-per-node N, or --opt gres=gpu:N",
    "-d": "--after-ok JOB (--after-any, --after-fail)", "--dependency": "--after-ok JOB (--after-any, --after-fail)",
    "-o": "--output-dir DIR (each job gets its own directory there)", "--output": "--output-dir DIR",
    "--signal": "--signal-before SECONDS", "--wrap": "-- COMMAND ARGS...",
}


def native_flag(word: str, options: Mapping[str, Option]) -> Optional[str]:
    """torchhpc's spelling of Slurm's own flag ``word`` (``--exclusive`` -> ``--opt exclusive=1``), or None.
    ``options``: the backend's ``--opt`` table, whose help names the sbatch flag each key sets."""
    if word in SPELLED:
        return SPELLED[word]
    opt = next((o for o in options.values() if re.search(rf"\({re.escape(word)}\)", o.help)), None)
    return None if opt is None else f"--opt {opt.name}=" + ("1" if opt.type == "bool" else "VALUE")
