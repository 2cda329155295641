"""argv builders for the three launchers.

Values that must expand inside the job (``$SLURM_NNODES``, the rendezvous
endpoint) are passed in as :class:`~torchhpc.core.shell.Raw` by the scheduler;
everything else is a literal the shell module quotes.
"""

from __future__ import annotations

from collections.abc import Sequence

from torchhpc.core.shell import Raw
from torchhpc.core.spec import JobSpec
from torchhpc.launchers.boot import task_argv

__all__ = ["mpirun_argv", "srun_argv", "srun_step", "torchrun_argv"]


def torchrun_argv(
    spec: JobSpec,
    python: str,
    *,
    nnodes: str | Raw,
    rdzv_id: str | Raw,
    endpoint: str | Raw,
    node_rank: str | Raw | None = None,
    extra: Sequence[str] = (),
    worker_shim: str | Raw | None = None,
) -> list[str]:
    """``python -m torch.distributed.run`` (torchrun) with a c10d rendezvous.

    ``-m torch.distributed.run`` rather than ``torchrun`` so the interpreter
    that runs the workers is the one whose torch launched them (venvs, containers).
    ``worker_shim`` (the per-task shim's path, or ``TASK_REF`` in a batch script)
    starts every worker through it (``--no-python bash SHIM torchrun python ...``): under srun the workers inherit the agents' one-task-per-node
    SLURM_PROCID/SLURM_NTASKS, which the shim rewrites to each worker's rank.
    """
    argv: list[str] = [
        python,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        nnodes,
        "--nproc-per-node",
        str(spec.nproc_per_node),
    ]
    if node_rank is not None:
        argv += ["--node-rank", node_rank, "--master-addr", Raw('"$MASTER_ADDR"'), "--master-port", Raw('"$MASTER_PORT"')]
    else:
        argv += ["--rdzv-backend", "c10d", "--rdzv-id", rdzv_id, "--rdzv-endpoint", endpoint]
    argv += ["--max-restarts", spec.option("max_restarts", "0") or "0"]
    argv += list(extra)
    if worker_shim is not None:
        argv += ["--no-python", *task_argv(spec.entrypoint.argv(python), shim=worker_shim, launcher="torchrun")]
    else:
        argv += spec.entrypoint.script_argv()
    return argv


def srun_argv(tasks_per_node: int, *, cpus_per_task: int | None = None, extra: Sequence[str] = ()) -> list[str]:
    """The ``srun`` that starts a job step: one task per process for srun-direct, one per node for torchrun.

    ``--kill-on-bad-exit=1`` so one dead rank ends the step instead of leaving
    the others blocked in a collective until the time limit.
    """
    argv = ["srun", f"--ntasks-per-node={tasks_per_node}", "--kill-on-bad-exit=1"]
    if cpus_per_task:
        argv.append(f"--cpus-per-task={cpus_per_task}")
    argv += list(extra)
    return argv


def srun_step(options: Sequence[str], argv: Sequence[str]) -> list[str]:
    """``srun OPTIONS ARGV``: a command under a runtime's srun flags (pyxis), as ``container wrap`` prints it."""
    return ["srun", *options, *argv]


def mpirun_argv(
    np: str | Raw,
    per_node: int,
    *,
    export: Sequence[str] = (),
    hostfile: str | Raw | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """One ``mpirun`` over the whole allocation, each process one rank.

    ``--bind-to none`` because PyTorch runs its own thread pools (OpenMPI's
    default core binding pins all of a rank's threads to one core);
    ``-x NAME`` forwards the rendezvous variables to every rank.
    """
    argv: list[str] = ["mpirun", "-np", np, "--map-by", f"ppr:{per_node}:node", "--bind-to", "none"]
    if hostfile is not None:
        argv += ["--hostfile", hostfile]
    for name in export:
        argv += ["-x", name]
    argv += list(extra)
    return argv
