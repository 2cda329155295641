"""Before launch: does the script read what its launcher sets? (``torchhpc run``'s preflight).

:func:`preflight` reads a script before it is launched and refuses (or warns about) one that
reads variables the chosen launcher never sets, with a HINT naming the launcher that does.
Its home is here, below :mod:`torchhpc.env`, because every ``torchhpc run`` asks it: a submission
must not load the rank-side detection (:mod:`torchhpc.env.detect`) to read a script.
:mod:`torchhpc.env.compat` (the check inside a running rank) names these too. Stdlib only.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from torchhpc.core.launcher_kind import LauncherKind
from torchhpc.core.spec import JobSpec
from torchhpc.core.units import counted
from torchhpc.errors import SpecError

__all__ = ["PROVIDES", "STARTS_ITS_RANKS", "ScriptRead", "imports_torch", "preflight", "scan_script"]

# Which families of variables a (scheduler, launcher) gives every rank, truthfully.
# slurm/mpirun and slurm/torchrun get SLURM_* rewritten by the per-task shim.
PROVIDES: dict[tuple[str, str], frozenset[str]] = {
    ("slurm", "srun"): frozenset({"slurm", "idr_torch"}),
    ("slurm", "mpirun"): frozenset({"slurm", "openmpi", "mpi4py"}),
    ("slurm", "torchrun"): frozenset({"slurm", "idr_torch"}),
    ("pbs", "mpirun"): frozenset({"openmpi", "mpi4py"}),
}

# Schedulers that start the ranks themselves: a --launcher means nothing there (the local scheduler).
STARTS_ITS_RANKS = frozenset({"local"})

# What each family needs, for the HINT.
_RIGHT_LAUNCHER = {
    "slurm": "run it under Slurm: --scheduler slurm (srun, mpirun and torchrun all give each rank its SLURM_*)",
    "openmpi": "use --launcher mpirun (Open MPI sets OMPI_COMM_WORLD_* for every rank), or read RANK/WORLD_SIZE instead",
    "mpi4py": "use --launcher mpirun: only mpirun puts the ranks in one MPI COMM_WORLD "
    "(under srun or torchrun every rank is its own world of size 1)",
    "idr_torch": "use --scheduler slurm --launcher srun or torchrun (idr_torch reads an srun step's or torchrun's "
    "variables; mpirun's ranks on the first node are outside any step)",
}


@dataclass(frozen=True)
class ScriptRead:
    """A script reads a family of variables (``slurm``, ``openmpi``) or uses ``mpi4py``/``idr_torch``."""

    family: str
    what: str  # e.g. "SLURM_PROCID", "mpi4py"
    line: int
    hard: bool  # fails or is wrong without it: os.environ["X"], a top-level import
    guarded: bool = False  # the script tests for the family first ("X" in os.environ): it has its own fallback


_VARS = {
    "slurm": r"SLURM_(?:PROCID|LOCALID|NODEID|NTASKS|NPROCS|STEP_NUM_TASKS)",
    "openmpi": r"OMPI_COMM_WORLD_(?:RANK|SIZE|LOCAL_RANK|LOCAL_SIZE|NODE_RANK)",
}
_IMPORTS = {"mpi4py": "mpi4py", "idr_torch": "idr_torch"}


def scan_script(text: str) -> list[ScriptRead]:
    """What a Python script reads to find its rank: Slurm or Open MPI variables, mpi4py, idr_torch.

    A read is *hard* when it subscripts (``os.environ["SLURM_PROCID"]``) or
    imports at top level; it is *guarded* when the script tests for any
    variable of the family (``if "SLURM_PROCID" in os.environ``), as
    examples/pi.py does for every launcher: such a script has its own fallback.
    """
    found: list[ScriptRead] = []
    guarded: set[str] = set()
    for number, line in enumerate(text.splitlines(), 1):
        code = line.split("#", 1)[0]
        for family, module in _IMPORTS.items():
            m = re.match(rf"^(\s*)(?:from\s+{module}\b|import\s+{module}\b)", code)
            if m:
                found.append(ScriptRead(family, module, number, hard=not m.group(1)))
        for family, pattern in _VARS.items():
            for m in re.finditer(rf"(['\"]?)\b({pattern})\b\1", code):
                rest = code[m.end():]
                if m.group(1) and re.match(r"\s+(?:not\s+)?in\b", rest):
                    guarded.add(family)
                hard = bool(m.group(1)) and bool(re.search(r"\[\s*$", code[: m.start()])) and rest.lstrip().startswith("]")
                found.append(ScriptRead(family, m.group(2), number, hard))
    return [ScriptRead(r.family, r.what, r.line, r.hard, r.family in guarded) for r in found]


def _script_path(spec: JobSpec) -> str | None:
    ep = spec.entrypoint
    if ep.kind == "script":
        return ep.target
    if ep.kind == "command":
        return next((a for a in ep.args if a.endswith(".py")), None)
    return None


def preflight(spec: JobSpec, read_text: bool = True) -> list[str]:
    """Before launch: refuse a script that reads what this scheduler/launcher never sets.

    A hard read (``os.environ["OMPI_COMM_WORLD_RANK"]``, ``import mpi4py``)
    raises :class:`~torchhpc.errors.SpecError` with a HINT naming the launcher
    that sets it; a soft one (``.get("SLURM_PROCID", 0)``: a default decides
    the rank) comes back as a warning line; a guarded one (the script tests
    ``"X" in os.environ`` first) is the script's own business. ``TORCHHPC_COMPAT=warn`` turns refusals into
    warnings, ``TORCHHPC_COMPAT=off`` skips the check.
    """
    mode = os.environ.get("TORCHHPC_COMPAT", "refuse")
    path = _script_path(spec)
    if mode == "off" or path is None or not read_text:
        return []
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return []
    # Any torchrun (local, pbsdsh, pods) sets TORCHELASTIC_RUN_ID, which idr_torch recognises.
    have = PROVIDES.get((spec.scheduler, spec.launcher), frozenset({"idr_torch"} if spec.launcher is LauncherKind.TORCHRUN else ()))
    where = f"--scheduler {spec.scheduler}" + ("" if spec.scheduler in STARTS_ITS_RANKS else f" --launcher {spec.launcher}")
    warnings: list[str] = []
    refusals: list[tuple[str, str]] = []
    seen: set[str] = set()
    for read in sorted(scan_script(text), key=lambda r: not r.hard):  # a hard read of X wins over a soft one
        if read.family in have or read.guarded or read.family in seen:
            continue
        seen.add(read.family)  # one message per family: the first (hard) read names it
        if read.family == "mpi4py":
            msg = f"{path}:{read.line} uses mpi4py, but {where} starts no MPI world"
        elif read.family == "idr_torch":
            msg = f"{path}:{read.line} uses idr_torch, which detects Slurm steps and torchrun only, not {where}"
        else:
            msg = f"{path}:{read.line} reads {read.what}, which {where} does not set"
        if read.hard and mode != "warn":
            refusals.append((msg, _RIGHT_LAUNCHER[read.family]))
        else:
            tail = " (a default value decides the rank)" if not read.hard else ""
            warnings.append(f"{msg}{tail}. HINT: {_RIGHT_LAUNCHER[read.family]}")
    if refusals:
        msg, hint = refusals[0]
        more = f" (and {counted(len(refusals) - 1, 'more kind')})" if len(refusals) > 1 else ""
        raise SpecError(
            f"{msg}{more}: the script would fail or see the wrong world",
            f"{hint}; TORCHHPC_COMPAT=warn launches anyway; docs/compat.md has the table",
        )
    return warnings


_TORCH = re.compile(rb"^\s*(?:import|from)\s+(?:torch|lightning|pytorch_lightning|transformers|accelerate)\b", re.M)


def imports_torch(kind: str, target: str, cwd: str) -> bool:
    """Whether a program (``kind`` script or module) imports torch or a framework on it in its own source: where its
    ranks start warm, forked from an interpreter that imported torch once (schedulers/local/warm.py, boot/standby.sh).
    A program that never imports torch would only wait for a standby's import; one whose source is unknown: False."""
    path = ""
    if kind == "module":
        import importlib.util

        try:
            found = importlib.util.find_spec(target)
        except (ImportError, ValueError):
            found = None
        path = (found.origin or "") if found else ""
    elif kind == "script":
        path = os.path.join(cwd, target)
    try:
        with open(path, "rb") as f:
            return bool(_TORCH.search(f.read(1 << 20)))
    except OSError:
        return False
