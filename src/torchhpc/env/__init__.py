"""Inside a job: who am I? Stdlib only, never imports torch.

``detect()`` reads rank, world size, local rank and master from whichever
launcher started this process (torchrun, Open MPI, MPICH/Intel MPI, MVAPICH,
an srun step, Kubeflow/RunAI pods, a PBS job, or nothing at all);
``explain()`` shows every detector's verdict; ``export()`` writes torch's
``env://`` contract without overwriting what the user set; ``derive_port()``
is the MASTER_PORT every rank computes from the job id without talking.
"""

from __future__ import annotations

from torchhpc.env.base import DEFAULT_PORT, PORT_BASE, PORT_SPAN, DistEnv, Verdict, derive_port
from torchhpc.env.detect import PRIORITY, conflicts, detect, explain, export
from torchhpc.env.jobs import tasks_per_node

__all__ = [
    "DEFAULT_PORT",
    "PORT_BASE",
    "PORT_SPAN",
    "PRIORITY",
    "DistEnv",
    "Verdict",
    "conflicts",
    "derive_port",
    "detect",
    "explain",
    "export",
    "tasks_per_node",
]
