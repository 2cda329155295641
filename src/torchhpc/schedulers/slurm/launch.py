"""The Slurm job step that starts the ranks: what Slurm asks of the job's launcher.

Apart from slurm.py, which writes the rest of the sbatch script and submits it: here is the launch for each
launcher (torchrun: one srun task per node; srun: one task per rank; mpirun: one launcher process in the batch
step, its daemons started through Slurm), each task in its container (pyxis: srun flags instead), each rank's
output in its own file, and under the in-allocation supervisor the attempt's own nodes. ``torchhpc shell``
(slurm.py's ``shell_argv``) wraps its shell in the container the same way.
"""

from __future__ import annotations

import os
import sys

from torchhpc.core.script_reads import imports_torch
from torchhpc.core.shell import Raw, join, quote
from torchhpc.core.spec import JobSpec, default_python
from torchhpc.jobdir.log_wiring import LOG_DIR_VAR, LOG_REF, log_argv, torchrun_per_rank
from torchhpc.launchers import TASK_REF, launcher_of, mpirun_argv, srun_argv, task_argv
from torchhpc.launchers.boot import BOOT_VAR, boot_ref
from torchhpc.schedulers.batch.step import in_container, job_container, job_env_names, torchrun_command
from torchhpc.schedulers.batch.supervised import warm_restarts

__all__ = ["RENDEZVOUS_VARS", "container_srun_options", "standby_lines", "step_lines", "wrap"]

RENDEZVOUS_VARS = ("MASTER_ADDR", "MASTER_PORT")


def wrap(spec: JobSpec, argv: list[str], interactive: bool = False) -> list[str]:
    """One container per task; pyxis is not a wrapper but srun flags (:func:`container_srun_options`)."""
    if spec.container is not None and spec.container.runtime == "pyxis":
        return argv
    return in_container(spec, argv, [*RENDEZVOUS_VARS, "SLURM_*", "PMIX_*", "OMPI_*"], interactive)


def _per_rank(spec: JobSpec, argv: list[str]) -> list[str]:
    """Each rank's output into its own file (:mod:`torchhpc.jobdir.logs`). The wrapper runs
    before the task shim and outside the container (with pyxis the whole task is inside it)."""
    return log_argv(argv, launcher_of(spec).rank_vars, wrapper=LOG_REF)


def container_srun_options(spec: JobSpec) -> list[str]:
    """The job's container as srun flags, for pyxis (it is no wrapper); none for a runtime that wraps the task (:func:`wrap`)."""
    if spec.container is None or spec.container.runtime != "pyxis":
        return []
    from torchhpc.containers import srun_options

    return srun_options(job_container(spec, spec.container))


def step_lines(spec: JobSpec) -> list[str]:
    """The job step(s) that start the ranks, for the chosen launcher: one srun of torchrun per node, one srun
    task per rank, or mpirun in the batch step; on the supervisor's nodes of the attempt where it runs."""
    python = default_python(spec)
    extra_srun = container_srun_options(spec)
    if spec.option("cpu_bind"):
        extra_srun = [f"--cpu-bind={spec.option('cpu_bind')}", *extra_srun]
    launcher = launcher_of(spec)
    if spec.supervised:  # each attempt on the supervisor's N nodes (batch/supervised.py)
        tasks: object = spec.nodes * launcher.tasks_per_node(spec)
        nodes: object = spec.nodes
        if spec.shrinks:  # the attempt's own size: fewer nodes after a shrink (the supervisor exports it)
            nodes = Raw('"$TORCHHPC_STEP_NNODES"')
            tasks = Raw('"$TORCHHPC_STEP_NNODES"') if launcher.per_node else Raw('"$TORCHHPC_STEP_NTASKS"')
        extra_srun = [Raw(f"--nodes={nodes}"), Raw(f"--ntasks={tasks}"), Raw('--nodelist="$TORCHHPC_STEP_NODES"'),
                      *extra_srun]
    if launcher.per_node:
        nnodes, rdzv_id = Raw('"$SLURM_NNODES"'), Raw('"$SLURM_JOB_ID"')
        if spec.supervised:
            nnodes = Raw('"$TORCHHPC_STEP_NNODES"') if spec.shrinks else Raw(str(spec.nodes))
            rdzv_id = Raw('"$SLURM_JOB_ID-$TORCHHPC_RESTART_COUNT"')
        cmd = torchrun_command(spec, python, nnodes=nnodes, rdzv_id=rdzv_id, worker_shim=TASK_REF)
        cmd = torchrun_per_rank(cmd)
        step = srun_argv(1, cpus_per_task=launcher.cpus_per_task(spec), extra=["--label", *extra_srun])
        return [join([*step, *wrap(spec, cmd)])]
    rank_cmd = task_argv(spec.entrypoint.argv(python), shim=TASK_REF, launcher=spec.launcher)
    if launcher.own_step:
        step = srun_argv(spec.nproc_per_node, cpus_per_task=launcher.cpus_per_task(spec), extra=["--label", *extra_srun])
        return [join([*step, *_per_rank(spec, wrap(spec, rank_cmd))])]
    # mpirun: one launcher process in the batch step, OpenMPI starts its daemons through Slurm.
    np: Raw = Raw('"$SLURM_NTASKS"')
    extra_mpi = ["--tag-output", "-x", LOG_DIR_VAR]
    if spec.supervised:  # the supervisor's hosts, each with its slots (mpirun --host node1:2,node3:2)
        np = Raw('"$TORCHHPC_STEP_NTASKS"') if spec.shrinks else Raw(str(spec.nodes * spec.nproc_per_node))
        extra_mpi += ["-x", "TORCHHPC_RESTART_COUNT", "--host", Raw('"$TORCHHPC_STEP_HOSTS"')]
    mpi = mpirun_argv(np, spec.nproc_per_node, export=[*RENDEZVOUS_VARS, "PATH", BOOT_VAR, *job_env_names(spec)],
                      extra=extra_mpi)
    return [join([*mpi, *_per_rank(spec, wrap(spec, rank_cmd))])]


def standby_lines(spec: JobSpec) -> list[str]:
    """One import of torch a node where a node runs two ranks or more of this Python and the program imports torch:
    its ranks (and torchrun's agent) fork from a standby interpreter (boot/standby.sh, boot/warm.py). Not under the
    supervisor (it starts its own, supervisor/standby.py), in a container or with another Python (no standby of its
    kind there), nor for a program that never imports torch (its ranks would wait for the import). One rank a node
    stays cold: torchrun's agent and its one worker would share one import, a small gain for a second step."""
    python = default_python(spec)
    if spec.supervised or not warm_restarts(spec) or python != sys.executable or spec.nproc_per_node < 2:
        return []
    if not imports_torch(spec.entrypoint.kind, spec.entrypoint.target, os.getcwd()):
        return []
    return [f". {boot_ref('standby.sh')} {quote(python)}  # torch loaded once a node (TORCHHPC_WARM=off: per rank)"]
