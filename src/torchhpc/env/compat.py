"""Code we did not write: what other frameworks' cluster detection will read, and whether it is true.

Lightning, submitit, idr_torch, mpi4py and hand-written scripts each detect
rank and world from ``SLURM_*``, ``OMPI_*``, ``PMI_*`` or torch's variables.
torchhpc's per-task shim (``boot/task.sh``) makes every such
variable truthful or absent; this module is the check that it is so, and the
check before launch that a script will find what it reads:

- :func:`disagreements` lists the variables set in this process that name
  another rank or another world than the one detected (``torchhpc env
  --explain``, ``torchhpc doctor --in-job``).
- :func:`scan_script` and :func:`preflight` read a script before it is
  launched and refuse (or warn about) one that reads variables the chosen
  launcher never sets, with a HINT naming the launcher that does. Their home is
  :mod:`torchhpc.core.script_reads` (every ``run`` asks them: this package's
  rank-side detection stays unloaded); they are this module's names too.

Facts about who reads what are data (:data:`READERS`, :data:`PROVIDES`);
docs/compat.md is generated from them and from the matrix run on the dev cluster.
Stdlib only.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from torchhpc.core.script_reads import PROVIDES, ScriptRead, preflight, scan_script
from torchhpc.env.base import DistEnv

__all__ = [
    "PROVIDES",
    "READERS",
    "Disagreement",
    "ScriptRead",
    "disagreements",
    "preflight",
    "scan_script",
]

# Who reads each variable to decide its rank or world (from their installed sources).
READERS: dict[str, str] = {
    "SLURM_PROCID": "Lightning's SLURMEnvironment, submitit's JobEnvironment, idr_torch and scripts reading SLURM_PROCID",
    "SLURM_LOCALID": "Lightning's SLURMEnvironment, submitit's JobEnvironment, idr_torch and scripts reading SLURM_LOCALID",
    "SLURM_NODEID": "Lightning's SLURMEnvironment (node rank) and submitit's JobEnvironment",
    "SLURM_NTASKS": "Lightning's SLURMEnvironment (world size), submitit's JobEnvironment and scripts reading SLURM_NTASKS",
    "SLURM_STEP_NUM_TASKS": "idr_torch (world size)",
    "SLURM_NTASKS_PER_NODE": "Lightning's SLURMEnvironment (checked against devices=)",
    "OMPI_COMM_WORLD_RANK": "scripts and frameworks reading Open MPI's variables (DeepSpeed, Horovod)",
    "OMPI_COMM_WORLD_SIZE": "scripts and frameworks reading Open MPI's variables (DeepSpeed, Horovod)",
    "OMPI_COMM_WORLD_LOCAL_RANK": "scripts and frameworks reading Open MPI's variables (DeepSpeed, Horovod)",
    "PMI_RANK": "MPICH/Intel MPI-aware code (DeepSpeed, accelerate)",
    "PMI_SIZE": "MPICH/Intel MPI-aware code (DeepSpeed, accelerate)",
    "MV2_COMM_WORLD_RANK": "MVAPICH-aware code",
    "MV2_COMM_WORLD_SIZE": "MVAPICH-aware code",
    "RANK": "torch's env:// init and Lightning's TorchElastic/Lightning environments",
    "WORLD_SIZE": "torch's env:// init and Lightning's TorchElastic/Lightning environments",
    "LOCAL_RANK": "torch's env:// init and Lightning's TorchElastic/Lightning environments",
}



@dataclass(frozen=True)
class Disagreement:
    """A variable set in this process that names another rank or world than the detected one."""

    name: str
    value: str
    expected: str
    truth: str  # "this process is rank 3"
    readers: str

    @property
    def message(self) -> str:
        return f"{self.name}={self.value} but {self.truth}: {self.readers} would see the wrong world"

    @property
    def hint(self) -> str:
        if self.name.startswith("SLURM_"):
            return (
                "start each rank through torchhpc's per-task shim (`torchhpc run --scheduler slurm --launcher "
                "mpirun|torchrun` does): it rewrites the Slurm task variables to the rank's; see docs/compat.md"
            )
        if self.name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            return "these came from outside this launch (the submitting shell?): unset them, or start through torchhpc run"
        return (
            f"{self.name} belongs to another launcher than the one that started this process: unset it, "
            "or start through torchhpc run, whose per-task shim drops it; see docs/compat.md"
        )


_RANK, _WORLD, _LOCAL = "this process is rank {}", "the world has {} processes", "this process is local rank {}"


def _checks(e: DistEnv) -> tuple[tuple[str, int, str], ...]:
    return (
        ("RANK", e.rank, _RANK),
        ("WORLD_SIZE", e.world_size, _WORLD),
        ("LOCAL_RANK", e.local_rank, _LOCAL),
        ("SLURM_PROCID", e.rank, _RANK),
        ("SLURM_LOCALID", e.local_rank, _LOCAL),
        ("SLURM_NODEID", e.node_rank, "this process is on node {}"),
        ("SLURM_NTASKS", e.world_size, _WORLD),
        ("SLURM_STEP_NUM_TASKS", e.world_size, _WORLD),
        ("SLURM_NTASKS_PER_NODE", e.local_world_size, "{} processes run on this node"),
        ("OMPI_COMM_WORLD_RANK", e.rank, _RANK),
        ("OMPI_COMM_WORLD_SIZE", e.world_size, _WORLD),
        ("OMPI_COMM_WORLD_LOCAL_RANK", e.local_rank, _LOCAL),
        ("PMI_RANK", e.rank, _RANK),
        ("PMI_SIZE", e.world_size, _WORLD),
        ("MV2_COMM_WORLD_RANK", e.rank, _RANK),
        ("MV2_COMM_WORLD_SIZE", e.world_size, _WORLD),
    )


def disagreements(dist_env: DistEnv, environ: Mapping[str, str] | None = None) -> list[Disagreement]:
    """Variables in ``environ`` (default ``os.environ``) that contradict ``dist_env``.

    Only for a process that is one of several (``world_size > 1``): in a batch
    script the job's SLURM_NTASKS describe the job, not the shell, and nobody
    launched there takes them for its own.
    """
    env = os.environ if environ is None else environ
    if dist_env.world_size <= 1:
        return []
    return [Disagreement(name, env[name], str(want), truth.format(want), READERS[name])
            for name, want, truth in _checks(dist_env) if env.get(name) is not None and env[name].strip() != str(want)]
