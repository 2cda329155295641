"""The memory tier at a node loss and at the job's end: persisted to disk, then (at the end) freed on every node
(jobdir/shm.py does the work).

Why here: the supervisor is what outlives every attempt of the job, so it is the one place that knows the job is
over (done, failed, preempted or requeued) while its nodes can still be reached.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Mapping
from typing import Any, Optional

from torchhpc.supervisor.liveness import PROBE_TIMEOUT_S

__all__ = ["free_memory", "persist_after_loss"]


def _saved_to_memory(env: Mapping[str, str], job: str) -> bool:
    """Whether the job has a memory tier: only a job that saved to memory has one, on its rank 0's node (this one,
    where the first attempt ran). No step is started for any other job."""
    from torchhpc.jobdir.shm import shm_base

    return any(shm_base(env).glob(f"torchhpc-{job}-*"))


def free_memory(alloc: Any, env: Mapping[str, str], job: str, say: Callable[[str], None]) -> None:
    """The job's newest memory-tier checkpoint written to disk, then the memory tier gone from every node's
    shared memory, for a job that saved to memory."""
    if not _saved_to_memory(env, job):
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


def persist_after_loss(alloc: Any, env: Mapping[str, str], job: str, nodes: list[str],
                       say: Callable[[str], None]) -> Optional[subprocess.Popen[bytes]]:
    """After a node loss the job goes on, but the lost node's ranks have one copy left (their peer's): the
    survivors write the newest memory checkpoint to disk, in the background and at the lowest priority, so that
    a second loss or a requeue before the next save resumes from it, not from the last disk save. Never waited
    for; its line (``the memory tier's newest checkpoint is on disk``) goes to the job's output."""
    if not nodes or not _saved_to_memory(env, job):
        return None
    argv = ["nice", "-n", "19", sys.executable, "-m", "torchhpc.jobdir.shm", "--persist", job]
    try:
        return subprocess.Popen(alloc.on_nodes(argv, nodes), stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except Exception as e:  # the job goes on from memory all the same
        say(f"could not persist the memory-tier checkpoints after the node loss: {e}")
        return None
