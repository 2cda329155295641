"""``torchhpc doctor``: one table of pass/warn/fail lines, each failure with a HINT.

Runs on a login node (torch optional there) and inside a job (``in_job``):
versions, GPUs visible vs requested, /dev/shm, memlock and stack limits, RDMA
devices inside the container, whether the chosen interface reaches the
master, whether the rendezvous port is free, the Slurm client, container
runtimes, the launcher's task geometry, and whether pip could replace the
base image's torch.

Every check is a small function of a :class:`Context` (environment mapping,
command :class:`~torchhpc.core.proc.Runner`, filesystem root for /sys, /proc
and /dev), so unit tests feed fakes and the real run reads the machine. A
check that cannot apply says ``skip`` with the reason; a machine without GPUs
gets ``warn``/``skip``, never ``fail``, unless GPUs were requested.

The checks live in three modules: :mod:`~torchhpc.doctor.node` (the machine),
:mod:`~torchhpc.doctor.job` (the job around it) and :mod:`~torchhpc.doctor.gpu`
(``doctor --gpu``: measured speed of the GPUs, torch imported in this process).
A new check is a function of :class:`Context` in the module it fits, plus one
line in :data:`CHECKS`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict

from torchhpc.doctor.base import STATUSES, Check, Context
from torchhpc.doctor.job import (
    check_containers,
    check_environment,
    check_geometry,
    check_interface,
    check_port,
    check_slurm,
)
from torchhpc.doctor.node import (
    check_gpus,
    check_memlock,
    check_pip_torch,
    check_python,
    check_rdma,
    check_shm,
    check_stack,
    check_torch,
)

__all__ = [
    "CHECKS",
    "STATUSES",
    "Check",
    "Context",
    "check_containers",
    "check_environment",
    "check_geometry",
    "check_gpus",
    "check_interface",
    "check_memlock",
    "check_pip_torch",
    "check_port",
    "check_python",
    "check_rdma",
    "check_shm",
    "check_slurm",
    "check_stack",
    "check_torch",
    "run_checks",
    "to_json",
]

CHECKS: tuple[tuple[str, Callable[[Context], Check]], ...] = (
    ("python", check_python),
    ("torch", check_torch),
    ("gpus", check_gpus),
    ("/dev/shm", check_shm),
    ("memlock", check_memlock),
    ("stack", check_stack),
    ("rdma", check_rdma),
    ("interface", check_interface),
    ("port", check_port),
    ("slurm", check_slurm),
    ("containers", check_containers),
    ("geometry", check_geometry),
    ("environment", check_environment),
    ("pip-torch", check_pip_torch),
)


def run_checks(ctx: Context, only: list[str] | None = None, skip_torch: bool = False) -> list[Check]:
    """Run every check (or ``only`` those); an unexpected exception becomes that check's ``fail``."""
    if skip_torch:
        ctx._torch = {"error": "skipped (--no-torch)"}
    results = []
    for name, fn in CHECKS:
        if only and name not in only:
            continue
        try:
            results.append(fn(ctx))
        except Exception as e:  # a doctor must report, not crash
            results.append(Check(name, "fail", f"check crashed: {type(e).__name__}: {e}", "please report this"))
    return results


def to_json(results: list[Check], ctx: Context) -> str:
    return json.dumps(
        {"in_job": ctx.in_job, "checks": [asdict(c) for c in results],
         "ok": not any(c.status == "fail" for c in results)},
        indent=2,
    )
