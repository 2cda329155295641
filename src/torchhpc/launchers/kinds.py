"""The launchers as objects: geometry, the per-task shim, and where each one runs.

Geometry is the users' most common failure, so each launcher states it once:
torchrun is one task per node that forks the local workers (its task gets the
CPUs of all of them); srun-direct and mpirun start one task per process, and
those processes need the task shim to get torch's ``env://`` variables.
Schedulers ask these objects instead of comparing launcher names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torchhpc.core.spec import JobSpec
from torchhpc.errors import SpecError
from torchhpc.launchers.builders import mpirun_argv, srun_argv, torchrun_argv

__all__ = ["DEFAULT_CPUS_PER_PROC", "LAUNCHERS", "MPIRUN", "SRUN", "TORCHRUN", "Launcher", "get_launcher"]

# CPUs per process when neither --cpus-per-proc nor a profile's cpus_per_gpu says (stated in --help).
DEFAULT_CPUS_PER_PROC = 1


@dataclass(frozen=True)
class Launcher:
    name: str
    summary: str
    # one task per node that starts the node's processes itself (torchrun), or one task per process
    per_node: bool
    # schedulers it runs under
    schedulers: frozenset[str]
    # builds the launcher's own argv (see torchhpc.launchers.builders)
    argv: Callable[..., list[str]]
    # what to use instead, said when a scheduler cannot run it
    instead: str = ""

    @property
    def needs_shim(self) -> bool:
        """Processes started one per rank see only their launcher's variables: the shim maps them."""
        return not self.per_node

    def tasks_per_node(self, spec: JobSpec) -> int:
        return 1 if self.per_node else spec.nproc_per_node

    def cpus_per_task(self, spec: JobSpec) -> int:
        """CPUs per scheduler task: per process, times the node's processes for a per-node launcher.

        Per process: ``--cpus-per-proc``, else the site's ``cpus_per_gpu`` x GPUs per
        process, else :data:`DEFAULT_CPUS_PER_PROC`. Always a number, so it is always
        rendered: Slurm's own default is one CPU per *task*, which leaves a torchrun
        task's workers sharing a single core.
        """
        per_proc = spec.cpus_per_task
        if per_proc is None and spec.cpus_per_gpu and spec.gpus_per_node:
            per_proc = spec.cpus_per_gpu * max(1, spec.gpus_per_node // spec.nproc_per_node)
        if per_proc is None:
            per_proc = DEFAULT_CPUS_PER_PROC
        return per_proc * spec.nproc_per_node if self.per_node else per_proc

    def check(self, scheduler: str) -> None:
        if scheduler not in self.schedulers:
            raise SpecError(
                f"--launcher {self.name} does not run under --scheduler {scheduler} "
                f"(it runs under {', '.join(sorted(self.schedulers))})",
                self.instead or None,
            )


TORCHRUN = Launcher(
    "torchrun",
    "one torchrun per node; it forks --nproc-per-node workers (c10d rendezvous)",
    per_node=True,
    schedulers=frozenset({"local", "slurm", "pbs", "kubernetes", "runai"}),
    argv=torchrun_argv,
)
SRUN = Launcher(
    "srun",
    "srun-direct: Slurm starts one task per process",
    per_node=False,
    schedulers=frozenset({"slurm"}),
    argv=srun_argv,
    instead="srun needs Slurm: elsewhere use --launcher torchrun (or mpirun on PBS, the Sockeye way)",
)
MPIRUN = Launcher(
    "mpirun",
    "one mpirun over the allocation; each MPI process is one rank",
    per_node=False,
    schedulers=frozenset({"slurm", "pbs"}),
    argv=mpirun_argv,
    instead="kubernetes and runai start one pod per node, the local scheduler its ranks itself: use --launcher torchrun",
)
LAUNCHERS: dict[str, Launcher] = {x.name: x for x in (TORCHRUN, SRUN, MPIRUN)}


def get_launcher(name: str) -> Launcher:
    try:
        return LAUNCHERS[name]
    except KeyError:
        raise SpecError(f"--launcher {name!r} is not a launcher", f"choose one of: {', '.join(LAUNCHERS)}") from None
