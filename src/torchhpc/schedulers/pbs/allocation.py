"""A PBS job's nodes: ``$PBS_NODEFILE`` inside the job, ``exec_host`` (qstat) outside; commands on
them through ``pbsdsh``, PBS's own task spawner (the MOMs start the tasks; no ssh).

``pbsdsh`` talks to the job's MOM through the TM interface, whose credentials only the job's own
processes hold: a command on the nodes is started from inside the job (its batch shell, an
interactive ``qsub -I`` session), and refused from a login node with that fix named.
PBS Pro's ``pbsdsh`` (without Torque's ``-u``) starts one copy per line of the node file, that is
per MPI slot, and ``-n`` takes a single node: the command runs on every node of the job, and the
readers keep one answer per process (host, pid) and the rows of the nodes they asked for.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torchhpc.errors import SchedulerError
from torchhpc.schedulers.allocation import Allocation

__all__ = ["PBSAllocation"]


class PBSAllocation(Allocation):
    job_var = "PBS_JOBID"

    def nodes(self, status: Any = None) -> list[str]:
        nodefile = self.env.get("PBS_NODEFILE", "")
        if self.inside() and nodefile:
            with open(nodefile) as f:
                return list(dict.fromkeys(line.strip() for line in f if line.strip()))
        return super().nodes(status)

    def on_nodes(self, argv: Sequence[str], nodes: Sequence[str]) -> list[str]:
        if not self.inside():
            raise SchedulerError(
                f"pbsdsh reaches the nodes of PBS job {self.job_id} only from inside it (PBS_JOBID here: "
                f"{self.env.get('PBS_JOBID') or 'unset'})",
                "run it in the job: its script, or an interactive `qsub -I` session of it",
            )
        return ["pbsdsh", "--", *argv]
