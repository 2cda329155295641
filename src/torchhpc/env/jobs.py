"""Job-level sources: a Slurm srun step, Kubeflow/RunAI pods, a PBS job script, and the fallbacks.

These describe tasks, pods or the job itself. Each one checks that it really
is looking at one rank per process before it claims a rank: a Slurm batch
script has SLURM_PROCID=0 but is not rank 0 of N, and a pod's RANK is the
pod's index, not the process's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from torchhpc.core.hostlist import expand
from torchhpc.core.units import counted
from torchhpc.env.base import DEFAULT_PORT, DistEnv, Verdict, derive_port, first_set, get_int, need_int
from torchhpc.env.context import LOOPBACK, JobContext, resolve_master
from torchhpc.env.detector import Detector, ceil_div
from torchhpc.errors import EnvironmentDetectionError, TorchHPCError

__all__ = [
    "KubeflowDetector",
    "LocalDetector",
    "ManualEnvDetector",
    "PBSDetector",
    "RunAIDetector",
    "SlurmDetector",
    "TrainJobDetector",
    "tasks_per_node",
]


def tasks_per_node(text: str) -> list[int]:
    """Slurm's compact ``2(x3),1`` -> ``[2, 2, 2, 1]``."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part)
        if not m:
            raise EnvironmentDetectionError(
                f"tasks-per-node value {text!r} is not Slurm's N(xM),... form",
                "check SLURM_STEP_TASKS_PER_NODE",
            )
        out.extend([int(m.group(1))] * int(m.group(2) or 1))
    return out


class SlurmDetector(Detector):
    """An srun task: SLURM_PROCID with the step's SLURM_STEP_* (step values before job values).

    Only an srun step has SLURM_STEP_NUM_TASKS; the batch script and an salloc
    shell carry SLURM_PROCID=0 and the job's SLURM_NTASKS but are one process
    that starts the others, so they do not match.
    """

    name = "slurm"
    variables = (
        "SLURM_JOB_ID",
        "SLURM_JOB_NODELIST",
        "SLURM_NTASKS",
        "SLURM_PROCID",
        "SLURM_STEP_NUM_TASKS",
        "SLURM_LOCALID",
        "SLURM_NODEID",
        "SLURM_STEP_NUM_NODES",
        "SLURM_STEP_TASKS_PER_NODE",
        "SLURM_STEP_NODELIST",
        "SLURM_STEP_ID",
        "MASTER_ADDR",
        "MASTER_PORT",
    )

    def probe(self, env: Mapping[str, str], ctx: JobContext) -> Verdict:
        job = first_set(env, "SLURM_JOB_ID", "SLURM_JOBID")
        if not job:
            return self.miss("SLURM_JOB_ID not set")
        if not first_set(env, "SLURM_STEP_NUM_TASKS"):
            return self.miss(
                f"Slurm job {job[1]} but no SLURM_STEP_NUM_TASKS: the batch script or an salloc shell, "
                "not an srun task (its SLURM_PROCID=0 is not a rank); start ranks with srun"
            )
        if not first_set(env, "SLURM_PROCID"):
            return self.miss(f"Slurm step in job {job[1]} without SLURM_PROCID")
        step = first_set(env, "SLURM_STEP_ID", "SLURM_STEPID")
        reason = (
            f"srun task of job {job[1]} step {step[1] if step else '?'} "
            f"(SLURM_PROCID={env['SLURM_PROCID']}, SLURM_STEP_NUM_TASKS={env['SLURM_STEP_NUM_TASKS']})"
        )

        def build() -> DistEnv:
            notes: list[str] = []
            rank = need_int(env, "SLURM_PROCID")
            world = need_int(env, "SLURM_STEP_NUM_TASKS")
            local_rank = get_int(env, "SLURM_LOCALID", default=0)
            node_rank = get_int(env, "SLURM_NODEID", default=0)
            num_nodes = get_int(env, "SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES", default=1)
            assert local_rank is not None and node_rank is not None and num_nodes is not None
            per_node = first_set(env, "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
            if per_node:
                counts = tasks_per_node(per_node[1])
                lws = counts[node_rank] if node_rank < len(counts) else counts[-1]
            else:
                lws = ceil_div(world, num_nodes)
                notes.append(f"SLURM_STEP_TASKS_PER_NODE not set: assumed {lws} tasks per node")
            hosts: tuple[str, ...] = ()
            nodelist = first_set(env, "SLURM_STEP_NODELIST")
            if nodelist:
                try:
                    hosts = tuple(expand(nodelist[1]))
                except TorchHPCError as e:
                    raise EnvironmentDetectionError(
                        f"SLURM_STEP_NODELIST={nodelist[1]!r} cannot be parsed: {e.message}",
                        "set MASTER_ADDR explicitly",
                    ) from None
            addr, port, more = resolve_master(
                env, ctx, source=self.name, single_host=num_nodes == 1, hosts=hosts, hosts_from="SLURM_STEP_NODELIST"
            )
            return DistEnv(
                rank, world, local_rank, lws, node_rank, num_nodes, addr, port,
                source=self.name, job_id=job[1], scheduler="slurm", notes=(*notes, *more),
            ).validate("SLURM_PROCID/SLURM_STEP_NUM_TASKS/SLURM_LOCALID/SLURM_NODEID")

        return self.hit(reason, build)


class KubeflowDetector(Detector):
    """A Kubeflow PyTorchJob pod: RANK is the *pod's* index.

    The training-operator sets MASTER_ADDR, MASTER_PORT, RANK (pod index) and
    WORLD_SIZE (pods in older operators, pods × nprocPerNode in newer ones),
    plus PET_NNODES / PET_NODE_RANK / PET_NPROC_PER_NODE for torchrun. So the
    node count comes from PET_NNODES when it is a number, else WORLD_SIZE; the
    processes per pod from TORCHHPC_NPROC_PER_NODE or PET_NPROC_PER_NODE
    (default 1). With several processes per pod and no LOCAL_RANK this
    process's rank is unknowable: that is an error, never a guess.
    """

    name = "kubeflow"
    label = "Kubeflow PyTorchJob pod"
    variables = (
        "KUBERNETES_SERVICE_HOST",
        "PET_NNODES",
        "PET_NODE_RANK",
        "PET_NPROC_PER_NODE",
        "TORCHHPC_NPROC_PER_NODE",
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
    )
    scheduler = "kubernetes"

    def recognised(self, env: Mapping[str, str]) -> str | None:
        pet = first_set(env, "PET_NNODES", "PET_NODE_RANK", "PET_NPROC_PER_NODE")
        if pet:
            return f"{pet[0]} set"
        if first_set(env, "KUBERNETES_SERVICE_HOST") and first_set(env, "RANK") and first_set(env, "WORLD_SIZE"):
            return "RANK/WORLD_SIZE inside a Kubernetes pod"
        return None

    def probe(self, env: Mapping[str, str], ctx: JobContext) -> Verdict:
        why = self.recognised(env)
        if not why:
            return self.miss(f"no {self.label} markers")
        if not first_set(env, "RANK", "PET_NODE_RANK"):
            return self.miss(f"{why} but neither RANK nor PET_NODE_RANK is set")
        reason = f"{self.label} ({why}); RANK/WORLD_SIZE count pods, not processes"
        return self.hit(reason, lambda: self.build(env, ctx))

    def build(self, env: Mapping[str, str], ctx: JobContext) -> DistEnv:
        notes: list[str] = []
        pod_rank = need_int(env, "PET_NODE_RANK", "RANK")
        nproc_var = first_set(env, "TORCHHPC_NPROC_PER_NODE", "PET_NPROC_PER_NODE")
        if nproc_var is None:
            nproc = 1
        elif nproc_var[1].isdigit():
            nproc = int(nproc_var[1])
        else:
            raise EnvironmentDetectionError(
                f"{nproc_var[0]}={nproc_var[1]!r}: processes per pod are decided by torchrun at start",
                "launch the processes with torchrun --nproc_per_node=$PET_NPROC_PER_NODE (it sets LOCAL_RANK)",
            )
        nnodes = first_set(env, "PET_NNODES")
        if nnodes and nnodes[1].isdigit():
            pods = int(nnodes[1])
        elif nnodes:
            raise EnvironmentDetectionError(
                f"PET_NNODES={nnodes[1]!r} is an elastic range: the pod count is decided at rendezvous",
                "launch with torchrun (it reads PET_NNODES) and detect inside its workers",
            )
        else:
            pods = need_int(env, "WORLD_SIZE")
            notes.append("pod count from WORLD_SIZE (pods, not processes)")
        local_rank = get_int(env, "LOCAL_RANK")
        if local_rank is None:
            if nproc > 1:
                raise EnvironmentDetectionError(
                    f"{self.label}: {nproc} processes per pod ({nproc_var[0] if nproc_var else ''}) "
                    f"but no LOCAL_RANK: RANK={env.get('RANK')} is the pod's index, not this process's rank",
                    f"start the processes with torchrun --nnodes {pods} --node_rank $RANK "
                    f"--nproc_per_node {nproc} --rdzv_endpoint $MASTER_ADDR:$MASTER_PORT",
                )
            local_rank = 0
        addr_var = first_set(env, "MASTER_ADDR")
        if addr_var is None and pods > 1:
            raise EnvironmentDetectionError(
                f"{self.label}: {pods} pods but MASTER_ADDR is not set",
                "the operator sets MASTER_ADDR on PyTorchJob pods with a Master replica; set it in the manifest",
            )
        addr = addr_var[1] if addr_var else LOOPBACK
        port = get_int(env, "MASTER_PORT")
        if port is None:
            # Each pod has its own network namespace: torch's default cannot collide.
            port = DEFAULT_PORT
            notes.append(f"MASTER_PORT not set: torch default {DEFAULT_PORT}")
        return DistEnv(
            pod_rank * nproc + local_rank, pods * nproc, local_rank, nproc, pod_rank, pods, addr, port,
            source=self.name, job_id=None, scheduler=self.scheduler, notes=tuple(notes),
        ).validate("RANK/PET_NODE_RANK/WORLD_SIZE/PET_NNODES/PET_NPROC_PER_NODE")


class TrainJobDetector(Detector):
    """A Kubeflow Trainer v2 ``TrainJob`` pod: only ``PET_*`` variables, one set per node.

    The v2 controller injects PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK (the
    pod's Job completion index), PET_MASTER_ADDR and PET_MASTER_PORT, and no
    MASTER_ADDR/RANK/WORLD_SIZE. PET_MASTER_ADDR is the v2 marker: v1's
    PyTorchJob sets the first three PET_* names but MASTER_ADDR instead. The node
    rank, node count, world size and master follow; the process rank needs
    LOCAL_RANK, which only torchrun's workers have, so a pod with several
    processes and no LOCAL_RANK is an error that still names the node's place.
    """

    name = "trainjob"
    variables = (*(f"PET_{n}" for n in ("NNODES", "NPROC_PER_NODE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")),
                 "LOCAL_RANK")

    def probe(self, env: Mapping[str, str], ctx: JobContext) -> Verdict:
        if not first_set(env, "PET_MASTER_ADDR"):
            return self.miss("PET_MASTER_ADDR not set (Kubeflow Trainer v2 sets it in TrainJob pods)")
        missing = [n for n in ("PET_NNODES", "PET_NODE_RANK") if not first_set(env, n)]
        if missing:
            return self.miss(f"PET_MASTER_ADDR set but {' and '.join(missing)} not")
        reason = f"Kubeflow Trainer v2 TrainJob pod (PET_MASTER_ADDR={env['PET_MASTER_ADDR'].strip()}): PET_* count nodes"
        return self.hit(reason, lambda: self.build(env))

    def build(self, env: Mapping[str, str]) -> DistEnv:
        node_rank, nodes = need_int(env, "PET_NODE_RANK"), need_int(env, "PET_NNODES")
        raw = (env.get("PET_NPROC_PER_NODE") or "1").strip()
        if not raw.isdigit():
            raise EnvironmentDetectionError(
                f"PET_NPROC_PER_NODE={raw!r}: the processes per node are decided by torchrun at start",
                "set trainer.numProcPerNode in the TrainJob (torchhpc always does)",
            )
        nproc = int(raw)
        addr = env["PET_MASTER_ADDR"].strip()
        port = get_int(env, "PET_MASTER_PORT")
        notes = [f"node {node_rank} of {nodes}, {counted(nproc, 'process', 'processes')} per node: world size {nodes * nproc} (PET_*)"]
        if port is None:
            port = DEFAULT_PORT
            notes.append(f"PET_MASTER_PORT not set: torch default {DEFAULT_PORT}")
        local_rank = get_int(env, "LOCAL_RANK")
        if local_rank is None:
            if nproc > 1:
                raise EnvironmentDetectionError(
                    f"TrainJob pod: node {node_rank} of {nodes}, {nproc} processes per node (world size "
                    f"{nodes * nproc}), master {addr}:{port}; but no LOCAL_RANK, so this process is the pod, not a rank",
                    "start the processes with torchrun (it reads the PET_* variables and sets each worker's rank)",
                )
            local_rank = 0
        return DistEnv(
            node_rank * nproc + local_rank, nodes * nproc, local_rank, nproc, node_rank, nodes, addr, port,
            source=self.name, job_id=None, scheduler="kubernetes", notes=tuple(notes),
        ).validate("PET_NODE_RANK/PET_NNODES/PET_NPROC_PER_NODE/LOCAL_RANK")


class RunAIDetector(KubeflowDetector):
    """``runai submit-dist pytorch``: a PyTorchJob underneath, with RUNAI_* variables.

    RunAI's WORLD_SIZE and RANK count pods (the RunAI on RCP guide warns about exactly
    this) and its ``--workers`` is pods − 1. Checked before Kubeflow so the
    source says runai.
    """

    name = "runai"
    label = "RunAI distributed pod"
    scheduler = "runai"

    def recognised(self, env: Mapping[str, str]) -> str | None:
        runai = sorted(k for k in env if k.startswith("RUNAI_"))
        if runai and first_set(env, "RANK", "PET_NODE_RANK"):
            return f"{runai[0]} set"
        return None


class PBSDetector(Detector):
    """A PBS job script run directly, outside mpirun: one process.

    PBS starts no ranks itself; multi-node jobs run ``mpirun --hostfile
    $PBS_NODEFILE`` and the MPI detectors (which take the master from the
    nodefile) win. What is left under PBS is the job script's own process.
    """

    name = "pbs"
    variables = ("PBS_JOBID", "PBS_NODEFILE", "MASTER_PORT")

    def probe(self, env: Mapping[str, str], ctx: JobContext) -> Verdict:
        job = first_set(env, "PBS_JOBID")
        if not job:
            return self.miss("PBS_JOBID not set")
        reason = f"PBS job {job[1]} script outside mpirun: a single process ({ctx.describe()})"

        def build() -> DistEnv:
            port = get_int(env, "MASTER_PORT") or derive_port(job[1])
            addr = first_set(env, "MASTER_ADDR")
            return DistEnv(
                0, 1, 0, 1, 0, 1, addr[1] if addr else LOOPBACK, port,
                source=self.name, job_id=job[1], scheduler="pbs",
                notes=("ranks under PBS come from mpirun --hostfile $PBS_NODEFILE",),
            )

        return self.hit(reason, build)


class ManualEnvDetector(Detector):
    """RANK and WORLD_SIZE exported by hand (no launcher, no pod): taken as process ranks."""

    name = "env"
    variables = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")

    def probe(self, env: Mapping[str, str], ctx: JobContext) -> Verdict:
        if not (first_set(env, "RANK") and first_set(env, "WORLD_SIZE")):
            return self.miss("RANK and WORLD_SIZE not both set")
        reason = f"RANK={env['RANK']} WORLD_SIZE={env['WORLD_SIZE']}, taken as process ranks set by hand"

        def build() -> DistEnv:
            rank = need_int(env, "RANK")
            world = need_int(env, "WORLD_SIZE")
            addr, port, notes = resolve_master(env, ctx, source=self.name, single_host=world == 1)
            return DistEnv(
                rank, world, 0, 1, rank, world, addr, port,
                source=self.name, job_id=ctx.job_id, scheduler=ctx.scheduler,
                notes=("one process per host assumed (no LOCAL_RANK)", *notes),
            ).validate("RANK/WORLD_SIZE")

        return self.hit(reason, build)


# A single process inside a job but outside any step of it: what that usually is, per scheduler.
_OUTSIDE_A_STEP = {"slurm": "a batch script or salloc shell, not an srun step"}


class LocalDetector(Detector):
    """The fallback: one process, no launcher. Always matches."""

    name = "local"
    variables = ()

    def probe(self, env: Mapping[str, str], ctx: JobContext) -> Verdict:
        if ctx.scheduler:
            where = _OUTSIDE_A_STEP.get(ctx.scheduler)
            reason = f"single process inside {ctx.describe()}" + (f" ({where})" if where else "")
        else:
            reason = "fallback: a single process"

        def build() -> DistEnv:
            port = get_int(env, "MASTER_PORT")
            if port is None:
                port = derive_port(ctx.job_id) if ctx.job_id else DEFAULT_PORT
            addr = first_set(env, "MASTER_ADDR")
            return DistEnv(
                0, 1, 0, 1, 0, 1, addr[1] if addr else LOOPBACK, port,
                source=self.name, job_id=ctx.job_id, scheduler=ctx.scheduler,
            )

        return self.hit(reason, build)
