"""A local job's ranks start warm: one interpreter imports torch, and each rank is forked from it.

Why: ``import torch`` costs each new Python 1-2 CPU-seconds (loading libtorch, registering its operators), and
a local job of N ranks paid it N times on the same machine at the same moment. Here one standby interpreter
(``boot/warm.py serve``, the same one a supervised job's restarts use) imports it once; each rank is a small
client (``warm.py run PYTHON ARGS...``) that hands the standby its program, descriptors, environment and
directory, and ends as the forked rank ends. The ranks' wall-clock start is the same as N imports side by side
(one import), their CPU is one import instead of N, and the pages torch filled are shared until written.

Only where it pays and cannot change what runs: two ranks or more, no container, no setup lines, ``PYTHON
script`` or ``PYTHON -m module``, whose source imports torch (or a framework on it); ``TORCHHPC_WARM=off`` in
the environment or ``--env`` turns it off. A rank the standby cannot take (it is not up, it refused) starts
cold, as before, and its log says so.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from torchhpc.core.script_reads import imports_torch
from torchhpc.core.spec import JobSpec
from torchhpc.core.units import is_off
from torchhpc.launchers.boot import BOOT_DIR

__all__ = ["SWITCH", "WARM_VAR", "LocalStandby"]

SWITCH = "TORCHHPC_WARM"  # supervisor/standby.py: the same switch
WARM_VAR = "TORCHHPC_WARM_STANDBY"  # boot/warm.py: the same name (held equal by a test)
_BIND_S = 5.0  # how long to wait for the standby's socket before the ranks start cold


class LocalStandby:
    """The standby of one local attempt: started by :meth:`start` where warm ranks pay, stopped by :meth:`stop`."""

    def __init__(self, spec: JobSpec, argv: Sequence[str], env: Mapping[str, str], run_id: str) -> None:
        self.argv, self.name = list(argv), f"torchhpc-warm-{run_id}"
        self.proc: subprocess.Popen[bytes] | None = None
        node = env.get("SLURMD_NODENAME") or os.uname().nodename.split(".")[0]  # warm.py's address(), the same
        self.address = f"@{self.name}-{node}"
        switch = {**env, **spec.env_dict}.get(SWITCH, "on")
        self.wanted = (spec.nproc_per_node > 1 and spec.container is None and not spec.setup and not is_off(switch)
                       and imports_torch(spec.entrypoint.kind, spec.entrypoint.target, os.getcwd()))
        boot = os.path.abspath(BOOT_DIR)  # the standby is no rank: no boot (its threads must not be forked)
        path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.abspath(p) != boot]
        self.env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
        if path:
            self.env["PYTHONPATH"] = os.pathsep.join(path)

    def start(self) -> tuple[list[str], dict[str, str]]:
        """(argv, extra environment) for the ranks: the warm client's, or the program's as it is."""
        if not self.wanted:
            return self.argv, {}
        warm = os.path.join(BOOT_DIR, "warm.py")
        self.proc = subprocess.Popen([self.argv[0], warm, "serve", self.name, "torch"], env=self.env,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        deadline = time.monotonic() + _BIND_S
        while not self._bound():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                return self.argv, {}
            time.sleep(0.005)
        return [self.argv[0], "-I", "-S", warm, "run", *self.argv], {WARM_VAR: self.name}

    def _bound(self) -> bool:
        try:
            text = Path("/proc/net/unix").read_text()
        except OSError:
            return False
        return any(line.endswith(" " + self.address) for line in text.splitlines())

    def stop(self) -> None:
        """The standby and everything forked from it: gone. Every client has ended by now, but a rank whose
        client was killed is the standby's to stop, which it may not have done yet: stop them all here."""
        if self.proc is None:
            return
        from torchhpc.boot.warm import _kill_tree  # the standby's own sweep: its tree by parent, sessions and all

        _kill_tree(self.proc.pid)
        self.proc.wait()
        self.proc = None
