"""A running job's nodes, as its scheduler reaches them: the one object node-level questions go to.

The supervisor (restarts inside the allocation), ``torchhpc top``, the hang probe and ``doctor``
ask an :class:`Allocation` (``scheduler.allocation_of(job_id)``) instead of building ``srun``,
``scontrol`` or ``pbsdsh`` commands themselves:

* :meth:`~Allocation.nodes` and :meth:`~Allocation.alive`: the job's nodes, and whether one answers;
* :meth:`~Allocation.on_nodes`: the command that runs an argv once on each of some nodes inside the
  job's allocation (Slurm: a step beside the job's with ``srun --overlap``; PBS: ``pbsdsh``; local:
  the argv itself, a child process on this machine);
* :meth:`~Allocation.start_step` / :meth:`~Allocation.kill_step`: an attempt's step, ended without
  waiting on the controller;
* :meth:`~Allocation.requeue`: the job back in the queue with nodes excluded;
* :meth:`~Allocation.missing_clients` and :meth:`~Allocation.controller`: which of the backend's
  client commands are not on PATH, and whether its controller answers (``doctor``).

Each backend's subclass lives in its own package (``schedulers/slurm/allocation.py``, ...).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Optional, Protocol

from torchhpc.core.hostlist import expand
from torchhpc.core.proc import Runner
from torchhpc.errors import SchedulerError

__all__ = ["STANDBY_STEP", "Allocation", "ipv4"]

STANDBY_STEP = "torchhpc-warm"  # the step name of a standby interpreter (supervisor/standby.py): kill_step spares it


def ipv4(host: str) -> str:
    """The host's IPv4 address (torch's TCPStore prefers an address), else its name."""
    import socket  # here, not at import: submitting a job never resolves a host

    try:
        return str(socket.getaddrinfo(host, None, socket.AF_INET)[0][4][0])
    except OSError:
        return host


class SchedulerView(Protocol):
    """What an allocation asks of its :class:`~torchhpc.schedulers.api.Scheduler` (not imported: api imports this)."""

    name: ClassVar[str]
    runner: Runner

    def status(self, job_id: str) -> Any: ...


class Allocation:
    """One job's nodes. The base answers for a job whose nodes nothing can reach (``on_nodes`` raises);
    a backend overrides what its scheduler can do."""

    here: ClassVar[bool] = False  # the ranks are this machine's processes (the local scheduler)
    job_var: ClassVar[str] = ""  # the variable that holds the job id in the job's own environment
    nodes_var: ClassVar[str] = ""  # the variable that holds the job's node list there

    def __init__(self, scheduler: SchedulerView, job_id: str, env: Optional[Mapping[str, str]] = None) -> None:
        self.scheduler, self.runner = scheduler, scheduler.runner
        self.env = dict(os.environ if env is None else env)
        self.job_id = job_id or self.env.get(self.job_var, "")  # "": the job this process runs in

    def inside(self) -> bool:
        """Whether this process runs inside the job (its environment names the job)."""
        return bool(self.job_var) and self.env.get(self.job_var) == self.job_id

    def nodes(self, status: Any = None) -> list[str]:
        """The job's nodes in the allocation's order: from the job's environment inside it, else its status
        (``status``: the one the caller has just read, not asked again)."""
        if self.inside() and self.env.get(self.nodes_var):
            return expand(self.env[self.nodes_var])
        return expand((status or self.scheduler.status(self.job_id)).nodes or "")

    def alive(self, node: str, timeout: float = 2.0) -> bool:
        """Whether ``node`` answers; without a way to ask, every node counts as alive."""
        return True

    def rank_match(self) -> dict[str, str]:
        """Environment items that mark the job's rank processes on a node (for the probes)."""
        return {self.job_var: self.job_id} if self.job_var else {}

    def on_nodes(self, argv: Sequence[str], nodes: Sequence[str]) -> list[str]:
        """The command that runs ``argv`` once on each of ``nodes``, inside the job's allocation."""
        raise SchedulerError(f"the {self.scheduler.name} scheduler cannot run a command on its job's nodes",
                             "`torchhpc status` and `torchhpc logs -f` follow the job")

    def start_step(self, argv: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen[bytes]:
        """An attempt's step, in its own session so that :meth:`kill_step` reaches all of it."""
        return subprocess.Popen(list(argv), env=dict(env), start_new_session=True)

    def start_watch(self, argv: Sequence[str], node: str, env: Mapping[str, str],
                    name: str = "") -> subprocess.Popen[bytes]:
        """``argv`` on ``node`` as a step beside the job's that :meth:`kill_step` leaves running (the
        supervisor's watch on its own node, supervisor/sentinel.py; a standby interpreter, ``name`` the
        backend's step name for it); never waited for."""
        return subprocess.Popen(self.on_nodes(argv, [node]), env=dict(env), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)

    def kill_step(self, proc: subprocess.Popen[bytes], grace: float = 5.0) -> int:
        """End a step: TERM to its session (KILL at once without ``grace``), KILL to what is left after
        ``grace`` seconds. Returns its exit status."""
        from torchhpc.core.processes import stop_group  # its threads and queues only where a step is ended

        return stop_group(proc, grace)

    def requeue(self, exclude: Sequence[str] = ()) -> str:
        """Put the job back in the queue (its script runs again), without ``exclude``: "" when done, else
        why not. The base raises, as ``on_nodes`` does: this scheduler cannot requeue."""
        raise SchedulerError(f"the {self.scheduler.name} scheduler cannot requeue a job",
                             "end it and submit it again, with the failed nodes excluded")
