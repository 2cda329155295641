"""The client side of the live ``torchhpc top``: one long-lived probe per node, read in the background.

:mod:`torchhpc.observe.stream` runs on every node (once for the session through the job's
allocation: ``srun --overlap``, ``pbsdsh``, a plain child process for the local scheduler) and prints a batch of rank samples every refresh,
each node's batch ended by ``{"batch": N, "host": H}``. A reader thread keeps the newest complete
batch of each node; :meth:`LiveProbe.latest` hands them to the table.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Optional

from torchhpc.core.processes import stop_group
from torchhpc.observe.sample import RankSample

if TYPE_CHECKING:
    from torchhpc.schedulers.allocation import Allocation

__all__ = ["LiveProbe", "stream_argv"]


def stream_argv(alloc: Allocation, nodes: Sequence[str], every: float) -> list[str]:
    """The command that starts the per-node stream, once on each of ``nodes`` through the job's allocation."""
    match = [f"{k}={v}" for k, v in alloc.rank_match().items()]
    return alloc.on_nodes([sys.executable, "-m", "torchhpc.observe.stream", "--every", f"{every:g}", *match], nodes)


class LiveProbe:
    """Runs :func:`stream_argv` and keeps each node's newest batch."""

    def __init__(self, argv: Sequence[str], env: Optional[Mapping[str, str]] = None) -> None:
        self.proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, env=dict(env) if env else None,
                                     start_new_session=True)
        self._lock = threading.Lock()
        self._batches: dict[str, list[RankSample]] = {}
        self._pending: dict[str, list[RankSample]] = {}
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                d = json.loads(line)
            except ValueError:
                continue
            if not isinstance(d, dict):
                continue
            if "batch" in d:
                host = str(d.get("host", ""))
                with self._lock:
                    self._batches[host] = self._pending.pop(host, [])
                continue
            try:
                s = RankSample(**d)
            except TypeError:
                continue
            self._pending.setdefault(s.host, []).append(s)

    def latest(self, wait_s: float = 0.0) -> list[RankSample]:
        """Every node's newest batch; waits up to ``wait_s`` for the first one."""
        deadline = time.monotonic() + wait_s
        while not self._batches and time.monotonic() < deadline and self.proc.poll() is None:
            time.sleep(0.1)
        with self._lock:  # one row per process: PBS Pro's pbsdsh starts a stream per slot
            return list({(s.host, s.pid): s for batch in self._batches.values() for s in batch}.values())

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        if self.proc.poll() is None:
            stop_group(self.proc, grace=10.0)  # its own session: srun, pbsdsh and the local stream alike
