"""Warm starts: a standby interpreter on every node of the allocation, torch imported, for every attempt.

Why: after a node loss, ``import torch`` in every new rank was a third of the time to the next attempt's first
step. With ``--warm`` (the batch renderer adds it where the ranks run this Python: no container, no
``--python``), the supervisor starts ``boot/warm.py serve`` on each node as a step of its own beside the job's
(kill_step spares it), at the job's start, so it has imported torch long before a fault. Every attempt runs
with ``$TORCHHPC_WARM``, the first too (a node's ranks then import torch once between them): the task shim
hands the rank's program to the node's standby, which forks it with torch already imported (boot/warm.py); torchrun's agent is handed over the same way by
the rank boot's sitecustomize, before it imports anything, and its workers then start warm too. A node without a
standby, a program that is not ``PYTHON script`` or ``PYTHON -m module``, a rank of another Python: a cold start
as before, and its log says so.

Each standby holds one interpreter with torch imported (a few hundred MB of memory per node) until the job
ends. ``TORCHHPC_WARM=off`` in the job's environment: none is started.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from torchhpc.core.units import is_off
from torchhpc.launchers.boot import BOOT_DIR
from torchhpc.schedulers.allocation import STANDBY_STEP
from torchhpc.supervisor.liveness import HEARTBEAT_VAR

__all__ = ["PYTHON_VAR", "SWITCH", "WARM_VAR", "Standby"]

SWITCH = "TORCHHPC_WARM"  # the user's: off starts no standby
WARM_VAR = "TORCHHPC_WARM_STANDBY"  # a rank's: its standby's name (boot/warm.py, boot/task.sh: held equal by a test)
PYTHON_VAR = "TORCHHPC_WARM_PYTHON"
PRELOAD = ("torch",)


class Standby:
    """The job's standby interpreters: started once per node, named in the environment of later attempts."""

    def __init__(self, alloc: Any, job: str, python: str, env: Mapping[str, str], say: Callable[[str], None],
                 agent: bool = False) -> None:
        self.alloc, self.python, self.say = alloc, python, say
        self.name = f"torchhpc-warm-{job}"
        self.on: set[str] = set()
        self.wanted = not is_off(env.get(SWITCH, "on"))
        # the standby's own environment: the job's, without what makes an interpreter a rank (the boot's
        # cures and heartbeat start threads, which a process that forks must not have)
        boot = os.path.abspath(BOOT_DIR)
        path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.abspath(p) != boot]
        self.env = {k: v for k, v in env.items() if k not in ("PYTHONPATH", HEARTBEAT_VAR, WARM_VAR, PYTHON_VAR)}
        if path:
            self.env["PYTHONPATH"] = os.pathsep.join(path)
        # a launcher that is a Python of its own on each node (torchrun's agent) runs the boot too on a restart:
        # its sitecustomize hands the agent to the standby before it imports torch (boot/warm.py, agent)
        self.agent_path = os.pathsep.join([boot, *path]) if agent else ""

    def start(self, nodes: Iterable[str]) -> None:
        """A standby on each of ``nodes`` that has none yet; never waited for (it binds, then imports)."""
        todo = [h for h in nodes if h not in self.on] if self.wanted else []
        argv = [self.python, os.path.join(BOOT_DIR, "warm.py"), "serve", self.name, *PRELOAD]
        for h in todo:
            try:
                self.alloc.start_watch(argv, h, self.env, name=STANDBY_STEP)
                self.on.add(h)
            except Exception as e:  # restarts are cold there, as before
                self.say(f"no standby interpreter on {h} ({e}): its restarts start cold")
        if todo and self.on:
            self.say(f"standby interpreters (torch imported) on {','.join(sorted(self.on))}: every attempt starts warm")

    def env_for(self, attempt: int) -> dict[str, str]:
        """What an attempt's ranks are told: the standby's name, the first attempt's too (its ranks then share
        one import of torch per node instead of one each; a rank that comes before the standby is bound waits
        for it a moment, boot/warm.py)."""
        if not self.on:
            return {}
        return {WARM_VAR: self.name, PYTHON_VAR: self.python, **({"PYTHONPATH": self.agent_path} if self.agent_path else {})}
