"""The allocation around the processes: which scheduler, which job, which hosts.

Launchers (torchrun, mpirun, srun) say which rank a process is; the
allocation says where rank 0 lives and which job id the port derives from.
An ``mpirun`` inside a Slurm or PBS job takes its ranks from MPI and its
master from the job's first host; this module is the job half.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from torchhpc.core.hostlist import expand, read_nodefile
from torchhpc.core.units import counted
from torchhpc.env.base import DEFAULT_PORT, FileReader, derive_port, first_set, get_int
from torchhpc.errors import EnvironmentDetectionError, TorchHPCError

__all__ = ["JobContext", "job_context", "resolve_master"]

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class JobContext:
    scheduler: str | None
    job_id: str | None
    hosts: tuple[str, ...]
    hosts_from: str | None
    problem: str | None = None

    def describe(self) -> str:
        if self.scheduler is None:
            return "no scheduler job"
        text = f"{self.scheduler} job {self.job_id or '?'}"
        if self.hosts:
            text += f" on {counted(len(self.hosts), 'host')} from {self.hosts_from}, first {self.hosts[0]}"
        if self.problem:
            text += f" ({self.problem})"
        return text


def job_context(env: Mapping[str, str], read_file: FileReader) -> JobContext:
    """Slurm first (its variables leak into containers and MPI daemons it starts), then PBS, then Kubernetes."""
    slurm_id = first_set(env, "SLURM_JOB_ID", "SLURM_JOBID")
    if slurm_id:
        nodelist = first_set(env, "SLURM_JOB_NODELIST", "SLURM_NODELIST")
        hosts: tuple[str, ...] = ()
        problem = None
        if nodelist:
            try:
                hosts = tuple(expand(nodelist[1]))
            except TorchHPCError as e:
                problem = f"{nodelist[0]} unreadable: {e.message}"
        return JobContext("slurm", slurm_id[1], hosts, nodelist[0] if nodelist else None, problem)
    pbs_id = first_set(env, "PBS_JOBID")
    if pbs_id:
        nodefile = first_set(env, "PBS_NODEFILE")
        hosts = ()
        problem = None
        if nodefile:
            try:
                hosts = tuple(read_nodefile(read_file(nodefile[1])))
            except OSError as e:
                problem = f"PBS_NODEFILE={nodefile[1]} unreadable: {e.strerror or e}"
        return JobContext("pbs", pbs_id[1], hosts, "PBS_NODEFILE" if nodefile else None, problem)
    if first_set(env, "KUBERNETES_SERVICE_HOST"):
        return JobContext("kubernetes", None, (), None)
    return JobContext(None, None, (), None)


def resolve_master(
    env: Mapping[str, str],
    ctx: JobContext,
    *,
    source: str,
    single_host: bool,
    hosts: tuple[str, ...] = (),
    hosts_from: str | None = None,
    port_key: str | None = None,
) -> tuple[str, int, list[str]]:
    """MASTER_ADDR and MASTER_PORT for a launcher that does not set them itself.

    Order: the variables if set (the user or the batch script wins); else the
    first host of ``hosts`` (the launcher's own node list), then of the job's
    hosts; else loopback when every rank is on this host; else an error,
    because guessing a multi-host master is how jobs hang. The port derives
    from the job id (``port_key`` for launchers with their own job id, e.g.
    a bare ``mpirun``), else torch's default 29500.
    """
    notes: list[str] = []
    addr_var = first_set(env, "MASTER_ADDR")
    if addr_var:
        addr = addr_var[1]
        notes.append("MASTER_ADDR from the environment")
    elif hosts:
        addr = hosts[0]
        notes.append(f"MASTER_ADDR = first host of {hosts_from}")
    elif ctx.hosts:
        addr = ctx.hosts[0]
        notes.append(f"MASTER_ADDR = first host of {ctx.hosts_from}")
    elif single_host:
        addr = LOOPBACK
        notes.append("MASTER_ADDR = loopback (all ranks on this host)")
    else:
        raise EnvironmentDetectionError(
            f"{source}: ranks span several hosts but MASTER_ADDR is not set and no job host list is known",
            "export MASTER_ADDR=<rank 0's host> to every rank (e.g. `mpirun -x MASTER_ADDR=$(hostname)`)",
        )
    port = get_int(env, "MASTER_PORT")
    if port is not None:
        notes.append("MASTER_PORT from the environment")
    elif ctx.job_id:
        port = derive_port(ctx.job_id)
        notes.append(f"MASTER_PORT derived from {ctx.scheduler} job id {ctx.job_id}")
    elif port_key and (key_value := first_set(env, port_key)):
        port = derive_port(key_value[1])
        notes.append(f"MASTER_PORT derived from {port_key}")
    else:
        port = DEFAULT_PORT
        notes.append(f"MASTER_PORT = torch default {DEFAULT_PORT} (no job id to derive from)")
    return addr, port, notes
