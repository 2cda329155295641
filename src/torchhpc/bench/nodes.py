"""The rank side of ``torchhpc bench nodes``: one job measures every node, then pairs of nodes.

Started on every rank of one job (``python -m torchhpc.bench.nodes ...``, by
``torchhpc bench nodes`` through the normal scheduler path). It

1. learns which ranks share a node (``SLURMD_NODENAME``, else the host name);
2. per node: a compute check on every local rank (GPU matmul and
   device-to-device copy through :mod:`torchhpc.bench.gpu`; a CPU matmul on the
   first local rank otherwise) and an all_reduce among the node's ranks;
3. pairwise: the ring rounds, then confirmation rounds for suspects
   (:mod:`torchhpc.bench.nodes_plan` decides), one 2-node all_reduce of
   ``--size`` bytes per pair between the nodes' first ranks, pairs of a round
   running at the same time;
4. rank 0 writes the JSON the driver reads and prints progress lines
   (``bench-nodes: ...``) as each round ends.

Figures are medians of ``--iters`` timed calls after ``--warmup`` untimed
ones (compute: the best of them), and of the per-node checks the best of
``--passes`` passes: a busy moment only ever slows a run. All nodes run their
checks at the same moment (barriers between passes), so a burst of load from
elsewhere (on the dev cluster all nodes share one machine's CPUs) hits every
node alike and the ratios to the median stay meaningful.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import sys
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from torchhpc.bench import nodes_plan as plan
from torchhpc.core.units import parse_size

__all__ = ["PREFIX", "main", "natural_key", "node_name"]

PREFIX = plan.PREFIX
# Intra-node all_reduce size: gloo's busbw plateaus from 16 MiB, and these run
# N times one after the other where nodes share a machine.
INTRA_BYTES = 16 << 20


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


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m torchhpc.bench.nodes")
    p.add_argument("--size", default="64M")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--passes", type=int, default=3, help="passes of the per-node checks (best kept)")
    p.add_argument("--slow-ratio", type=float, default=0.7)
    p.add_argument("--deadline", type=float, default=0.0, help="epoch seconds after which no round starts")
    p.add_argument("--json", required=True)
    p.add_argument("--matmul-n", type=int, default=0, help="matmul side (default 8192 on GPU, 1024 on CPU)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    return p


class _Worker:
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

    def say(self, text: str) -> None:
        if self.rank == 0:
            print(PREFIX + text, flush=True)

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def _timed(self, fn: Any, iters: int, warmup: int) -> list[float]:
        for _ in range(warmup):
            fn()
        self.sync()
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            self.sync()
            times.append(time.perf_counter() - t0)
        return times

    # per-node checks -----------------------------------------------------
    def compute(self) -> dict[str, float]:
        """This rank's compute figures (GPU: its own device; CPU: only the node's first rank)."""
        torch = self.torch
        if self.cuda:
            from torchhpc.bench import gpu

            n = self.args.matmul_n or 8192
            return {"matmul": gpu._matmul(n, "bf16"), "copy": gpu._copy_bw(1 << 30)["d2d"]}
        if self.rank != self.leader[self.node]:
            return {}
        n = self.args.matmul_n or 1024
        a, b = torch.randn(n, n), torch.randn(n, n)
        threads = torch.get_num_threads()
        if self.shared:
            # Nodes sharing one machine's cores: a multi-threaded GEMM waits for its slowest
            # thread, and an oversubscribed core makes that a lottery. One thread each is fair.
            torch.set_num_threads(1)
        try:
            best = min(self._timed(lambda: torch.mm(a, b), 3, 1))
        finally:
            torch.set_num_threads(threads)
        return {"matmul": 2 * n**3 / best / 1e9}

    def intra(self, group: Any) -> float:
        world = len(self.ranks_of[self.node])
        size = min(self.size, INTRA_BYTES)
        buf = self.torch.ones(max(1, size // 4), dtype=self.torch.float32, device=self.ctx.device)
        times = self._timed(lambda: self.dist.all_reduce(buf, group=group), self.args.iters, self.args.warmup)
        return size / statistics.median(times) / 1e9 * 2 * (world - 1) / world

    def node_checks(self) -> dict[str, dict[str, float | None]]:
        """``--passes`` passes over the nodes, each node's best pass kept (load from others only slows)."""
        dist = self.dist
        multi = any(len(r) > 1 for r in self.ranks_of.values())
        groups = {n: dist.new_group(self.ranks_of[n]) for n in self.nodes} if multi else {}
        mine: dict[str, float] = {}

        def keep(figs: dict[str, float]) -> None:
            for k, v in figs.items():
                mine[k] = max(mine.get(k, v), v)

        for _ in range(self.args.passes):
            dist.barrier()  # every node measures at the same moment: a busy moment hits them all
            keep(self.compute())
            dist.barrier()
            if len(self.ranks_of[self.node]) > 1:
                got = self.intra(groups[self.node])
                if self.rank == self.leader[self.node]:
                    keep({"intra-node": got})
        everyone: list[Any] = [None] * self.ctx.world_size
        dist.all_gather_object(everyone, (self.node, mine))
        figures: dict[str, dict[str, float | None]] = {n: {} for n in self.nodes}
        for node, figs in everyone:
            for k, v in figs.items():
                old = figures[node].get(k)
                figures[node][k] = v if old is None else min(old, v)  # the slowest GPU names the node
        for g in groups.values():
            if g != dist.GroupMember.NON_GROUP_MEMBER:
                dist.destroy_process_group(g)
        return figures

    # pairs -------------------------------------------------------------------
    def _pair(self, group: Any) -> dict[str, Any]:
        torch, dist = self.torch, self.dist
        buf = torch.ones(max(1, self.size // 4), dtype=torch.float32, device=self.ctx.device)
        try:
            times = self._timed(lambda: dist.all_reduce(buf, group=group), self.args.iters, self.args.warmup)
            buf.fill_(1.0)
            dist.all_reduce(buf, group=group)
            self.sync()
            wrong = int((buf != 2.0).sum().item())
        except Exception as e:  # a broken link is a result (FAIL), not the end of the run
            return {"busbw": None, "error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
        if wrong:
            return {"busbw": None, "error": f"{wrong} wrong values"}
        med = statistics.median(times)
        # 2 ranks: busbw = algbw * 2(n-1)/n = algbw (nccl-tests' all_reduce factor)
        return {"busbw": self.size / med / 1e9, "times": [round(t, 6) for t in times]}

    def run_round(self, pairs: list[plan.Pair], stage: str, label: str) -> None:
        dist = self.dist
        t0 = time.time()
        timeout = timedelta(seconds=max(60.0, self.args.deadline - time.time()) if self.args.deadline else 600.0)
        groups = {p: dist.new_group([self.leader[p[0]], self.leader[p[1]]], timeout=timeout) for p in pairs}
        result = None
        for p, g in groups.items():
            if self.node in p and self.rank == self.leader[self.node] and self.node == p[0]:
                result = (p, self._pair(g))
            elif self.node in p and self.rank == self.leader[self.node]:
                self._pair(g)  # the other end takes part; the first node reports
        everyone: list[Any] = [None] * self.ctx.world_size
        dist.all_gather_object(everyone, result)
        for g in groups.values():
            if g != dist.GroupMember.NON_GROUP_MEMBER:
                dist.destroy_process_group(g)
        took = time.time() - t0
        for item in everyone:
            if item is None:
                continue
            p, res = item
            self.pairs.append({"pair": list(p), "stage": stage, **res})
            fig = f"{res['busbw']:.3f} GB/s" if res["busbw"] is not None else f"FAILED ({res['error']})"
            self.say(f"pair {plan.pair_key(p)} {fig}  [{label}, {took:.1f}s]")
        self.last_round = took

    def _go(self, pairs: list[plan.Pair]) -> bool:
        """Rank 0 decides whether the next round fits before the deadline; everyone follows."""
        ok = [True]
        if self.rank == 0 and self.args.deadline:
            need = max(getattr(self, "last_round", plan.MIN_ROUND_SECONDS), plan.MIN_ROUND_SECONDS)
            ok[0] = time.time() + need < self.args.deadline
        self.dist.broadcast_object_list(ok, src=0)
        if not ok[0]:
            self.skipped.append([plan.pair_key(p) for p in pairs])
        return bool(ok[0])

    def results(self, stages: tuple[str, ...] = ("ring", "retry", "confirm")) -> dict[plan.Pair, float | None]:
        """Each pair's best measurement (None when every try failed)."""
        out: dict[plan.Pair, float | None] = {}
        for rec in self.pairs:
            if rec["stage"] not in stages:
                continue
            p, v = (rec["pair"][0], rec["pair"][1]), rec["busbw"]
            old = out.get(p)
            out[p] = v if old is None else (old if v is None else max(old, v))
        return out

    def _decide(self, what: str, ring: list[plan.Pair]) -> Any:
        """Rank 0 plans the next rounds from the results so far; every rank gets the same plan."""
        box: list[Any] = [None]
        if self.rank == 0:
            got = self.results()
            med = statistics.median([v for p, v in got.items() if p in ring and v is not None] or [0.0]) or None
            if what == "retry":
                slow = [p for p in ring if plan.verdict(got.get(p), med, self.args.slow_ratio)[1] != plan.PASS]
                box[0] = plan.rounds_of(slow)
            else:
                bad, good = plan.suspects(self.nodes, got, med, self.args.slow_ratio)
                box[0] = (bad, plan.confirm_rounds(bad, good, got, len(self.nodes)))
        self.dist.broadcast_object_list(box, src=0)
        return box[0]

    def run(self) -> dict[str, Any]:
        self.say(f"{len(self.nodes)} node(s) {', '.join(self.nodes)}; {self.ctx.world_size} ranks, "
                 f"{self.ctx.backend}" + ("; the nodes share one kernel (namespaces on one machine)"
                                          if self.shared else ""))
        figures = self.node_checks()
        for n in self.nodes:
            self.say(f"node {n} " + ", ".join(f"{k} {v:.3g}" for k, v in figures[n].items() if v is not None))
        ring = plan.ring_pairs(self.nodes)
        rounds = plan.rounds_of(ring)
        for i, r in enumerate(rounds, 1):
            if self._go(r):
                self.run_round(r, "ring", f"ring round {i}/{len(rounds)}")
        # A slow ring pair is measured once more before it counts: on a shared machine a busy
        # moment slows a healthy pair, while a slow link is slow every time.
        retry = self._decide("retry", ring)
        for i, r in enumerate(retry, 1):
            pairs = [(p[0], p[1]) for p in r]
            if self._go(pairs):
                self.run_round(pairs, "retry", f"re-measure slow pairs {i}/{len(retry)}")
        bad, confirm = self._decide("confirm", ring)
        if bad:
            self.say(f"suspects {', '.join(bad)}: {sum(len(r) for r in confirm)} confirmation pair(s) "
                     "with known-good nodes")
        for i, r in enumerate(confirm, 1):
            pairs = [(p[0], p[1]) for p in r]
            if self._go(pairs):
                self.run_round(pairs, "confirm", f"confirmation round {i}/{len(confirm)}")
        checks = [("matmul", "TFLOP/s" if self.cuda else "GFLOP/s"), ("copy", "GB/s"), ("intra-node", "GB/s")]
        rows = plan.node_rows(self.nodes, figures, checks, self.results(), ring, self.args.slow_ratio)
        return {
            "version": 1,
            "nodes": self.nodes,
            "ranks": {n: len(r) for n, r in self.ranks_of.items()},
            "backend": self.ctx.backend,
            "device": "cuda" if self.cuda else "cpu",
            "shared_kernel": self.shared,
            "size": self.size,
            "iters": self.args.iters,
            "warmup": self.args.warmup,
            "passes": self.args.passes,
            "slow_ratio": self.args.slow_ratio,
            "figures": figures,
            "pairs": self.pairs,
            "skipped_rounds": self.skipped,
            "rows": [r.to_dict() for r in rows],
            "elapsed": time.time() - self.start,
        }


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    worker = _Worker(args)
    from torchhpc.bench import context

    try:
        report = worker.run()
        if worker.rank == 0:
            tmp = args.json + ".tmp"
            with open(tmp, "w") as fh:
                json.dump(report, fh, indent=1)
            os.replace(tmp, args.json)  # the driver never reads a half-written file
            worker.say(f"done in {report['elapsed']:.1f}s, JSON in {args.json}")
    finally:
        context.cleanup(worker.ctx)
    return 0


if __name__ == "__main__":
    sys.exit(main())
