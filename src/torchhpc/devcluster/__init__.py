"""A real multi-node Slurm cluster on one Linux box, for tests and demos.

One network namespace per node plus one for the controller, munged, slurmctld,
one slurmd per node (and MariaDB + slurmdbd for ``sacct``), all recorded in one
state directory so ``down`` stops exactly what ``up`` started::

    from torchhpc.devcluster import load_state
    state = load_state()            # None when no cluster is up
    env = state.client_env()        # SLURM_CONF, PATH wrappers, OpenMPI-as-root settings
    runner.run(["sbatch", "job.sh"], env=env)

Stdlib only; never imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torchhpc.devcluster.config import CLUSTER_NAME, DEFAULT_STATE_DIR, PARTITION
from torchhpc.devcluster.state import ClusterState, default_state_dir, load_state, read_state

if TYPE_CHECKING:
    from torchhpc.devcluster.cluster import down, run_client, shell_argv, status, up

_CLUSTER = ("down", "run_client", "shell_argv", "status", "up")

__all__ = [
    "CLUSTER_NAME",
    "DEFAULT_STATE_DIR",
    "PARTITION",
    "ClusterState",
    "default_state_dir",
    "down",
    "load_state",
    "read_state",
    "run_client",
    "shell_argv",
    "status",
    "up",
]


def __getattr__(name: str) -> Any:
    """``up``, ``down``...: the bring-up machinery loads on first use, as every Slurm command of the CLI
    asks :func:`load_state` (is a dev cluster serving?) and must not pay for it."""
    if name in _CLUSTER:
        from torchhpc.devcluster import cluster

        return getattr(cluster, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
