"""A Slurm job's nodes: liveness from slurmd's port, steps beside the job's with ``srun --overlap``.

The liveness check is one TCP connection to the node's slurmd (``SlurmdPort``, 6818 by default)
with a short timeout: a node that lost power or its link does not answer, a busy one does (the
kernel completes the handshake; slurmd need not be scheduled). One handshake per node per check,
about 0.1 ms and three packets; nothing runs on the node, and Slurm's SlurmdTimeout is not waited for.
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import threading
from collections.abc import Mapping, Sequence
from typing import Optional

from torchhpc.core.processes import killpg
from torchhpc.schedulers.allocation import STANDBY_STEP, Allocation, ipv4

__all__ = ["DEFAULT_SLURMD_PORT", "WATCH_STEP", "SlurmAllocation", "overlap_step"]

DEFAULT_SLURMD_PORT = 6818
WATCH_STEP = "torchhpc-watch"  # the step name of the supervisor's watch on its own node (kill_step spares it)


def overlap_step(job_id: str, nodes: Sequence[str], argv: Sequence[str]) -> list[str]:
    """``argv`` once on each of ``nodes`` of a running job: a step beside the job's own (``--overlap``)
    that does not end the job when one node's copy fails."""
    n = len(nodes)
    return ["srun", "--overlap", f"--jobid={job_id}", f"--nodes={n}", f"--ntasks={n}", "--ntasks-per-node=1",
            "--kill-on-bad-exit=0", "--quiet", f"--nodelist={','.join(nodes)}", *argv]


class SlurmAllocation(Allocation):
    job_var = "SLURM_JOB_ID"
    nodes_var = "SLURM_JOB_NODELIST"
    _port: Optional[int] = None

    def slurmd_port(self) -> int:
        """The cluster's SlurmdPort (``scontrol show config``, asked once), 6818 when it cannot be read."""
        if self._port is None:
            done = self.runner.run(["scontrol", "show", "config"], check=False, timeout=30)
            m = re.search(r"^SlurmdPort\s*=\s*(\d+)", done.stdout, re.M)
            self._port = int(m.group(1)) if m else DEFAULT_SLURMD_PORT
        return self._port

    def alive(self, node: str, timeout: float = 2.0) -> bool:
        try:
            with socket.create_connection((ipv4(node), self.slurmd_port()), timeout=timeout):
                return True
        except OSError:
            return False

    def on_nodes(self, argv: Sequence[str], nodes: Sequence[str]) -> list[str]:
        return overlap_step(self.job_id, nodes, argv)

    def kill_step(self, proc: subprocess.Popen[bytes], grace: float = 5.0) -> int:
        """The step's srun processes are signalled directly (their session); our job steps are then
        cancelled with KILL in the background. ``squeue`` answers from the controller's memory at once;
        ``scancel`` of a step on a dead node waits for that node (about 12 s seen), so no one waits for it."""
        killpg(proc.pid, signal.SIGTERM if grace else signal.SIGKILL)
        listed = self.runner.run(["squeue", "-h", "-s", "-j", self.job_id, "-o", "%i %j"], check=False, timeout=10)
        steps = [p[0] for p in (line.split() for line in listed.stdout.splitlines())
                 if p and p[0].rsplit(".", 1)[-1].isdigit() and p[1:] not in ([WATCH_STEP], [STANDBY_STEP])]
        if steps:
            cancel = ["scancel", "--signal=KILL", *steps]
            threading.Thread(target=self.runner.run, args=(cancel,), kwargs={"check": False, "timeout": 60},
                             daemon=True).start()
        return super().kill_step(proc, grace)

    def start_watch(self, argv: Sequence[str], node: str, env: Mapping[str, str],
                    name: str = WATCH_STEP) -> subprocess.Popen[bytes]:
        """The watch as a step named :data:`WATCH_STEP` (``--job-name``: inside an allocation srun ignores
        SLURM_JOB_NAME), which :meth:`kill_step` leaves running when it cancels an attempt's steps."""
        srun, *rest = self.on_nodes(argv, [node])
        return subprocess.Popen([srun, f"--job-name={name}", *rest], env=dict(env), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)

    def requeue(self, exclude: Sequence[str] = ()) -> str:
        self.runner.run(["scontrol", "requeue", self.job_id], check=False, timeout=30)
        if not exclude:
            return ""
        done = self.runner.run(["scontrol", "update", f"JobId={self.job_id}", f"ExcNodeList={','.join(exclude)}"],
                               check=False, timeout=30)
        return "" if done.returncode == 0 else done.stderr.strip() or f"scontrol update answered {done.returncode}"
