"""A job's memory-tier checkpoints in each node's shared memory (torchhpc.dist.memtier): where they are, and
removing them when the job ends, so that a node's shared memory is never left full.

The directories are ``$TORCHHPC_SHM_DIR`` (default ``/dev/shm``) ``/torchhpc-<job>-<dir key>/``, ``<job>``
from the scheduler's variables (Slurm's job id, PBS's job number, the local run's id). The local scheduler
removes its run's at the end; the in-allocation supervisor runs ``python -m torchhpc.jobdir.shm JOB`` on
every node of the allocation when it ends (docs/resilience.md).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Optional

__all__ = ["SHM_ENV", "free", "job_key", "shm_base"]

SHM_ENV = "TORCHHPC_SHM_DIR"


def shm_base(environ: Mapping[str, str] = os.environ) -> Path:
    return Path(environ.get(SHM_ENV) or "/dev/shm")


def job_key(environ: Mapping[str, str] = os.environ) -> str:
    """The job's name in the directory: Slurm's or PBS's job id, else the local run's id (``local-<id>``)."""
    for var in ("SLURM_JOB_ID", "PBS_JOBID", "TORCHELASTIC_RUN_ID"):
        if environ.get(var):
            return environ[var].split(".")[0].replace("/", "_")
    return "nojob"


def free(job: Optional[str] = None, base: Optional[str] = None) -> list[str]:
    """Remove every memory tier of ``job`` (default: this process's job) on this machine; the paths removed."""
    root = Path(base) if base else shm_base()
    gone = []
    for d in root.glob(f"torchhpc-{job or job_key()}-*"):
        shutil.rmtree(d, ignore_errors=True)
        gone.append(str(d))
    return gone


if __name__ == "__main__":  # run on each node by the supervisor at the job's end: stdlib only, no torch
    free(sys.argv[1] if len(sys.argv) > 1 else None)
