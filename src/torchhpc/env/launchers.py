"""Process-level launchers: torchrun (and anything speaking its contract) and the MPIs.

These name the rank of *this process*. They outrank the job-level schedulers
because they run inside them: torchrun under srun, mpirun inside a Slurm or
PBS allocation, both inside Kubernetes pods, where the outer variables count
tasks, nodes or pods instead of processes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from torchhpc.env.base import DistEnv, Verdict, first_set, get_int, need_int
from torchhpc.env.context import JobContext, resolve_master
from torchhpc.env.detector import Detector, ceil_div

__all__ = ["MPICH", "MVAPICH", "OPENMPI", "MPIDetector", "MPIVars", "TorchrunDetector"]


class TorchrunDetector(Detector):
    """torch's ``env://`` contract: torchrun, ``torchhpc run``, the per-task shim.

    Plain RANK/WORLD_SIZE are not enough: Kubeflow and RunAI set those per pod.
    A process-level launcher also sets LOCAL_RANK (or GROUP_RANK, or
    TORCHELASTIC_RUN_ID for torchrun itself), which pods never get.
    """

    name = "torchrun"
    variables = (
        "TORCHELASTIC_RUN_ID",
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "NODE_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
    )
    markers: ClassVar[tuple[str, ...]] = ("TORCHELASTIC_RUN_ID", "LOCAL_RANK", "GROUP_RANK")

    def probe(self, env: Mapping[str, str], ctx: JobContext) -> Verdict:
        missing = [n for n in ("RANK", "WORLD_SIZE") if not first_set(env, n)]
        if missing:
            return self.miss(f"{' and '.join(missing)} not set")
        marker = next((m for m in self.markers if first_set(env, m)), None)
        if marker is None:
            return self.miss(
                "RANK/WORLD_SIZE set but no LOCAL_RANK, GROUP_RANK or TORCHELASTIC_RUN_ID: "
                "they may count pods (Kubeflow/RunAI), not processes"
            )
        if marker == "TORCHELASTIC_RUN_ID":
            reason = f"torchrun (TORCHELASTIC_RUN_ID={env['TORCHELASTIC_RUN_ID']})"
        else:
            reason = f"torchrun-style variables ({marker} set, no TORCHELASTIC_RUN_ID: torchhpc run, a task shim or by hand)"

        def build() -> DistEnv:
            notes: list[str] = []
            rank = need_int(env, "RANK")
            world = need_int(env, "WORLD_SIZE")
            local_rank = get_int(env, "LOCAL_RANK", default=0)
            assert local_rank is not None
            groups = get_int(env, "GROUP_WORLD_SIZE")
            lws = get_int(env, "LOCAL_WORLD_SIZE")
            if lws is None:
                lws = ceil_div(world, groups) if groups else world
                notes.append(f"LOCAL_WORLD_SIZE not set: assumed {lws}")
            node_rank = get_int(env, "GROUP_RANK", "NODE_RANK")
            if node_rank is None:
                node_rank = rank // lws
            num_nodes = groups or ceil_div(world, lws)
            addr, port, more = resolve_master(env, ctx, source=self.name, single_host=num_nodes == 1)
            return DistEnv(
                rank, world, local_rank, lws, node_rank, num_nodes, addr, port,
                source=self.name, job_id=ctx.job_id or env.get("TORCHELASTIC_RUN_ID"),
                scheduler=ctx.scheduler, notes=(*notes, *more),
            ).validate("RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE")

        return self.hit(reason, build)


@dataclass(frozen=True)
class MPIVars:
    """Where one MPI implementation keeps its numbers (facts as data)."""

    name: str
    label: str
    rank: str
    size: str
    local_rank: tuple[str, ...]
    local_size: tuple[str, ...]
    num_nodes: tuple[str, ...] = ()
    job_key: str | None = None


OPENMPI = MPIVars(
    "openmpi", "Open MPI mpirun",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
    ("OMPI_COMM_WORLD_LOCAL_RANK",), ("OMPI_COMM_WORLD_LOCAL_SIZE",),
    ("OMPI_MCA_orte_num_nodes",), "OMPI_MCA_ess_base_jobid",
)
MPICH = MPIVars(
    "mpich", "MPICH/Hydra, Intel MPI or another PMI launcher",
    "PMI_RANK", "PMI_SIZE",
    ("MPI_LOCALRANKID", "PALS_LOCAL_RANKID"), ("MPI_LOCALNRANKS", "PALS_LOCAL_SIZE"),
)
MVAPICH = MPIVars(
    "mvapich", "MVAPICH mpirun_rsh/mpiexec",
    "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE",
    ("MV2_COMM_WORLD_LOCAL_RANK",), ("MV2_COMM_WORLD_LOCAL_SIZE",),
)


class MPIDetector(Detector):
    """Ranks from an MPI launcher; master and port from the allocation around it.

    Inside a Slurm job, Open MPI starts its daemons with srun, so every rank
    also sees an srun step's SLURM_PROCID (the daemon's node index): MPI's own
    variables must win. node_rank assumes ranks are placed in slot (block)
    order, mpirun's default.
    """

    def __init__(self, spec: MPIVars) -> None:
        self.spec = spec
        self.name = spec.name
        self.variables = (
            spec.rank, spec.size, *spec.local_rank, *spec.local_size, *spec.num_nodes, "MASTER_ADDR", "MASTER_PORT"
        )

    def probe(self, env: Mapping[str, str], ctx: JobContext) -> Verdict:
        s = self.spec
        if not first_set(env, s.rank):
            return self.miss(f"{s.rank} not set")
        if not first_set(env, s.size):
            return self.miss(f"{s.rank} set but {s.size} is not")
        reason = f"{s.label} ({s.rank}={env[s.rank]}, {s.size}={env[s.size]})"
        if ctx.scheduler:
            reason += f" inside {ctx.describe()}"

        def build() -> DistEnv:
            notes: list[str] = []
            rank = need_int(env, s.rank)
            world = need_int(env, s.size)
            local_rank = get_int(env, *s.local_rank)
            lws = get_int(env, *s.local_size)
            if local_rank is None or lws is None:
                local_rank, lws = (local_rank or 0), (lws or 1)
                notes.append(f"local rank unknown ({'/'.join(s.local_rank)} not set): assumed one rank per host")
            nodes_var = get_int(env, *s.num_nodes) if s.num_nodes else None
            num_nodes = nodes_var or ceil_div(world, lws)
            node_rank = min(rank // lws, num_nodes - 1)
            addr, port, more = resolve_master(
                env, ctx, source=self.name, single_host=num_nodes == 1 or lws == world, port_key=s.job_key
            )
            return DistEnv(
                rank, world, local_rank, lws, node_rank, num_nodes, addr, port,
                source=self.name, job_id=ctx.job_id, scheduler=ctx.scheduler, notes=(*notes, *more),
            ).validate(f"{s.rank}/{s.size}/{'/'.join(s.local_rank)}")

        return self.hit(reason, build)
