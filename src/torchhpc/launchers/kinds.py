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

from torchhpc.core.launcher_kind import LauncherKind
from torchhpc.core.spec import JobSpec
from torchhpc.errors import SpecError
from torchhpc.launchers.tags import Tag, mpirun_tag, srun_tag, torchrun_tag

__all__ = ["DEFAULT_CPUS_PER_PROC", "LAUNCHERS", "MPIRUN", "SRUN", "TORCHRUN", "Launcher", "get_launcher", "launcher_of"]

# CPUs per process when neither --cpus-per-proc nor a profile's cpus_per_gpu says (stated in --help).
DEFAULT_CPUS_PER_PROC = 1


@dataclass(frozen=True)
class Launcher:
    kind: LauncherKind
    summary: str
    # schedulers it runs under
    schedulers: frozenset[str]
    # the variables that hold a process's rank where the per-rank log wrapper runs, first set wins
    # (srun and mpirun: before the task shim, their own; torchrun: around each worker, torch's RANK)
    rank_vars: str
    # its output tag's parser (torchhpc.launchers.tags): (rank, text), or None for a line without its tag
    parse_tag: Callable[[str, int], Tag]
    # what to use instead, said when a scheduler cannot run it
    instead: str = ""
    # the scheduler starts every rank as a task of a step of its own (srun); else the launcher is one
    # process (torchrun: one per node) that starts the ranks itself
    own_step: bool = False

    @property
    def name(self) -> str:
        return self.kind.value

    @property
    def per_node(self) -> bool:
        """One task per node that starts the node's processes itself (torchrun), or one task per process."""
        return self.kind.per_node

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

    def cpus_per_node(self, spec: JobSpec) -> int:
        """CPUs each node gives the job: the same total whatever the launcher (PBS's ``ncpus`` of a chunk)."""
        return self.cpus_per_task(spec) * self.tasks_per_node(spec)

    def check(self, scheduler: str) -> None:
        if scheduler not in self.schedulers:
            raise SpecError(
                f"--launcher {self.name} does not run under --scheduler {scheduler} "
                f"(it runs under {', '.join(sorted(self.schedulers))})",
                self.instead or None,
            )


TORCHRUN = Launcher(
    LauncherKind.TORCHRUN,
    "one torchrun per node; it forks --nproc-per-node workers (c10d rendezvous)",
    schedulers=frozenset({"local", "slurm", "pbs", "kubernetes", "runai"}),
    rank_vars="RANK",
    parse_tag=torchrun_tag,
)
SRUN = Launcher(
    LauncherKind.SRUN,
    "srun-direct: Slurm starts one task per process",
    schedulers=frozenset({"slurm"}),
    rank_vars="SLURM_PROCID",
    parse_tag=srun_tag,
    own_step=True,
    instead="srun needs Slurm: elsewhere use --launcher torchrun (or mpirun on PBS, the Sockeye way)",
)
MPIRUN = Launcher(
    LauncherKind.MPIRUN,
    "one mpirun over the allocation; each MPI process is one rank",
    schedulers=frozenset({"slurm", "pbs"}),
    rank_vars="OMPI_COMM_WORLD_RANK PMI_RANK PMIX_RANK",
    parse_tag=mpirun_tag,
    instead="kubernetes and runai start one pod per node, the local scheduler its ranks itself: use --launcher torchrun",
)
LAUNCHERS: dict[str, Launcher] = {x.name: x for x in (TORCHRUN, SRUN, MPIRUN)}


def get_launcher(name: str | LauncherKind) -> Launcher:
    """The launcher object of a kind (or of its name, as records and the CLI give it)."""
    try:
        return LAUNCHERS[name]
    except KeyError:
        raise SpecError(f"--launcher {name!r} is not a launcher", f"choose one of: {', '.join(LAUNCHERS)}") from None


def launcher_of(spec: JobSpec) -> Launcher:
    """The launcher a job runs with: what schedulers ask instead of comparing names."""
    return LAUNCHERS[spec.launcher]
