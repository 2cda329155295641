"""The memory tier at the job's end: persisted to disk, then freed on every node (jobdir/shm.py does the work).

Why here: the supervisor is what outlives every attempt of the job, so it is the one place that knows the job is
over (done, failed, preempted or requeued) while its nodes can still be reached.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Mapping
from typing import Any

from torchhpc.supervisor.liveness import PROBE_TIMEOUT_S

__all__ = ["free_memory"]



def free_memory(alloc: Any, env: Mapping[str, str], job: str, say: Callable[[str], None]) -> None:
    """The job's newest memory-tier checkpoint written to disk, then the memory tier gone from every node's
    shared memory. Only a job that saved to memory has any (its rank 0's node is this one, where the first
    attempt ran): no step is started at the end of any other job."""
    from torchhpc.jobdir.shm import shm_base

    if not any(shm_base(env).glob(f"torchhpc-{job}-*")):
        return
    nodes = [h for h in alloc.nodes() if alloc.alive(h, timeout=PROBE_TIMEOUT_S)]
    for args in (["--persist", job], [job]) if nodes else ():
        try:
            out = subprocess.run(alloc.on_nodes([sys.executable, "-m", "torchhpc.jobdir.shm", *args], nodes),
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, timeout=120).stdout
            for line in out.splitlines():
                say(line.removeprefix("torchhpc: "))
        except Exception as e:  # nothing was saved there, or a node is gone with its memory
            say(f"could not {'persist' if args[0] == '--persist' else 'free'} the memory-tier checkpoints: {e}")
