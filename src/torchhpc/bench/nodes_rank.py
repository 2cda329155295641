"""Where a rank of ``torchhpc bench nodes`` stands, and the lockstep every measurement of it runs in.

The worker (:mod:`torchhpc.bench.nodes`) measures nodes and pairs of nodes; what
each of those measurements stands on is here: which ranks share a node (and
whether all the nodes share one kernel, as on the dev cluster), the barriers that
start every rank's turn together, a timed call, and the ``--stat`` that picks the
figure. Kept apart so the worker reads as its stages (per-node checks, pair
rounds, report) and this as the machinery they share.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import time
from collections.abc import Callable
from typing import Any

from torchhpc.bench import nodes_plan as plan
from torchhpc.core.units import parse_size

__all__ = ["NodeRank", "natural_key", "node_name"]


def node_name(env: dict[str, str] | None = None) -> str:
    env = dict(os.environ) if env is None else env
    return env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def natural_key(name: str) -> list[Any]:
    """``node2`` before ``node10``."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip()
    except OSError:
        return socket.gethostname()


class NodeRank:
    """This rank among the job's nodes (made by every rank at once: it gathers who is where), and the
    lockstep its measurements run in."""

    def __init__(self, args: argparse.Namespace) -> None:
        import torch
        import torch.distributed as dist

        from torchhpc.bench import context

        self.torch, self.dist, self.args = torch, dist, args
        self.start = time.time()
        self.size = parse_size(args.size, "--size")
        self.ctx = context.init(args.device)
        self.rank = self.ctx.rank
        self.cuda = self.ctx.device.type == "cuda"
        me = {"rank": self.rank, "node": node_name(), "boot": _boot_id()}
        everyone: list[Any] = [None] * self.ctx.world_size
        dist.all_gather_object(everyone, me)
        self.nodes = sorted({e["node"] for e in everyone}, key=natural_key)
        self.ranks_of = {n: sorted(e["rank"] for e in everyone if e["node"] == n) for n in self.nodes}
        self.leader = {n: r[0] for n, r in self.ranks_of.items()}
        self.node = me["node"]
        self.shared = len(self.nodes) > 1 and len({e["boot"] for e in everyone}) == 1
        self.pairs: list[dict[str, Any]] = []
        self.skipped: list[list[str]] = []
        self.samples: dict[str, list[Any]] = {}  # this rank's per-pass figures, for the JSON

    def say(self, text: str) -> None:
        if self.rank == 0:
            print(plan.PREFIX + text, flush=True)

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def _lockstep(self, measure: Callable[[], Any] | None, steps: int, slot: int = 0, slots: int = 1,
                  min_steps: int = 0, cap: float | None = None) -> list[Any]:
        """Run ``measure`` ``steps`` times in step with every other rank; returns what it measured.

        Every rank (measuring or not) meets the others at a barrier before each turn, so
        concurrent measurements (pairs of a round, nodes on separate machines) start together
        and none gets the machine to itself at the end. With ``slots`` > 1 (nodes sharing one
        kernel) the nodes take turns, each measured alone, in an order rotated every step: a
        burst of load from elsewhere falls on all of them alike. With ``cap``, no step starts
        after ``cap`` seconds once ``min_steps`` are done (a slow pair's calls take seconds each).
        """
        out: list[Any] = []
        t0 = time.monotonic()
        for i in range(steps):
            if cap is not None and i >= min_steps:
                go = [time.monotonic() - t0 < cap]  # rank 0's clock decides for everyone
                self.dist.broadcast_object_list(go, src=0)
                if not go[0]:
                    break
            for turn in range(slots):
                self.dist.barrier()
                if measure is not None and (slot - i) % slots == turn:
                    out.append(measure())
        self.dist.barrier()
        return out

    def _call_seconds(self, fn: Callable[[], Any]) -> Callable[[], float]:
        def timed() -> float:
            t0 = time.perf_counter()
            fn()
            self.sync()
            return time.perf_counter() - t0

        return timed

    def pick(self, values: list[float], *, higher: bool) -> float:
        """--stat best: the best call (a busy moment only ever slows a call); median: the median call."""
        if self.args.stat == "median":
            return statistics.median(values)
        return max(values) if higher else min(values)
