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

from torchhpc.devcluster.cluster import down, run_client, shell_argv, status, up
from torchhpc.devcluster.config import CLUSTER_NAME, DEFAULT_STATE_DIR, PARTITION
from torchhpc.devcluster.state import ClusterState, default_state_dir, load_state, read_state

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
