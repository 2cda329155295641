"""What each rank of a local job is: torchrun's worker contract (its variables, in torchrun's order), the
variables every rank gets besides, and the command it runs. Pure functions of the job's spec (the dry run
prints them; :mod:`torchhpc.schedulers.local.local` starts the processes)."""

from __future__ import annotations

import os

from torchhpc.core.spec import JobSpec, default_python
from torchhpc.launchers.boot import boot_argv, boot_pythonpath
from torchhpc.schedulers.local.allocation import RUN_PREFIX

__all__ = ["CONTRACT", "MASTER_ADDR", "PER_RANK", "STALE", "common_env", "free_port", "new_run_id", "rank_env",
           "restart_env", "worker_argv"]

# torchrun's worker contract (torch/distributed/elastic/agent/server/local_elastic_agent.py),
# in its order. Every name is set for every rank.
CONTRACT = (
    "RANK",
    "LOCAL_RANK",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_NAME",
    "LOCAL_WORLD_SIZE",
    "WORLD_SIZE",
    "GROUP_WORLD_SIZE",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
)
# Per-rank names; the rest of CONTRACT is the same for every rank.
PER_RANK = ("RANK", "LOCAL_RANK", "ROLE_RANK")
# Left over from an enclosing torchrun, they would point our workers at the wrong place.
STALE = ("TORCHELASTIC_ERROR_FILE", "NODE_RANK", "TORCHHPC_JOB_DIR")  # an outer job's: never this run's
MASTER_ADDR = "127.0.0.1"


def free_port(host: str = MASTER_ADDR) -> int:
    """A TCP port nobody listens on now, found by binding port 0 (the kernel picks)."""
    import socket  # here, not at the top: the dry run and --help never need it

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def new_run_id() -> str:
    """A TORCHELASTIC_RUN_ID-style id, unique per run (torchrun's default is a uuid too)."""
    import uuid

    return RUN_PREFIX + uuid.uuid4().hex[:12]


def rank_env(
    spec: JobSpec, rank: int, *, master_addr: str, master_port: str | int, run_id: str
) -> dict[str, str]:
    """The torchrun contract for one rank of a single-node job (pure)."""
    n = spec.nproc_per_node
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "GROUP_RANK": "0",
        "ROLE_RANK": str(rank),
        "ROLE_NAME": "default",
        "LOCAL_WORLD_SIZE": str(n),
        "WORLD_SIZE": str(n),
        "GROUP_WORLD_SIZE": "1",
        "ROLE_WORLD_SIZE": str(n),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": master_port if isinstance(master_port, str) else str(master_port),
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_RUN_ID": run_id,
        # No agent hosts a TCPStore here: rank 0 creates it, as with env:// outside torchrun.
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
    }


def restart_env(spec: JobSpec, count: int) -> dict[str, str]:
    """Which attempt this is, as a supervised Slurm job's ranks and torchrun's workers are told."""
    if not spec.max_restarts:
        return {}
    return {"TORCHHPC_RESTART_COUNT": str(count), "TORCHELASTIC_RESTART_COUNT": str(count),
            "TORCHELASTIC_MAX_RESTARTS": str(spec.max_restarts)}


def common_env(spec: JobSpec) -> dict[str, str]:
    """Variables every rank gets besides the contract: unbuffered output, torchrun's thread default, the user's."""
    env = {"PYTHONUNBUFFERED": "1"}
    if spec.nproc_per_node > 1 and "OMP_NUM_THREADS" not in os.environ:
        # torchrun does the same: N ranks each using every core thrash a shared machine.
        env["OMP_NUM_THREADS"] = "1"
    env.update(spec.env_dict)
    if spec.container is None:  # in a container, worker_argv's boot_argv writes the boot directory there
        path = boot_pythonpath({**os.environ, **env})  # the exit cures (launchers/boot.py), unless switched off
        if path:
            env["PYTHONPATH"] = path
    return env


def worker_argv(spec: JobSpec) -> list[str]:
    """The command every rank runs: the entrypoint, in the container and after setup lines, if any."""
    argv = spec.entrypoint.argv(python=default_python(spec))
    if spec.container is not None:
        from torchhpc.containers import wrap  # lazily: most local runs have no container

        argv = wrap(
            spec.container,
            boot_argv(argv),
            gpus=spec.gpus_per_node,
            gpu_kind=spec.gpu_kind,
            pass_env=[*CONTRACT, "PYTHONUNBUFFERED", "OMP_NUM_THREADS", "TORCHHPC_*", *spec.env_dict],
        )
    if spec.setup:
        # Setup lines (module load ...) are shell; run them, then exec the rank's command.
        script = "\n".join([*spec.setup, 'exec "$@"'])
        argv = ["bash", "-c", script, "torchhpc-local", *argv]
    return list(argv)
