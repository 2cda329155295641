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

Step 1 and the lockstep every measurement runs in are :mod:`torchhpc.bench.nodes_rank`'s.

Figures are the best of ``--iters`` timed calls after ``--warmup`` untimed
ones (``--stat median`` for the median; pairs keep both in the JSON), and of
the per-node checks the best of ``--passes`` passes: on a shared machine a busy
moment only ever slows a call, while a slow GPU or a degraded link is slow in
every call. All nodes run their
checks at the same moment (barriers between passes), so a burst of load from
elsewhere (on the dev cluster all nodes share one machine's CPUs) hits every
node alike and the ratios to the median stay meaningful.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from torchhpc.bench import nodes_plan as plan
from torchhpc.bench.nodes_rank import NodeRank
from torchhpc.core.units import counted

__all__ = ["main"]

# Intra-node all_reduce size: gloo's busbw plateaus from 16 MiB, and these run
# N times one after the other where nodes share a machine.
INTRA_BYTES = 16 << 20
WARMUP_BYTES = 1 << 20
# A pair round starts no new call after this many seconds once one timed call is done: with
# the best call counting, one or two calls of a degraded link (seconds each) say enough.
PAIR_SECONDS = 6.0
NODE_RETRIES = 2  # times the per-node checks run again while one is slow (and the budget allows)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m torchhpc.bench.nodes")
    p.add_argument("--size", default="64M")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--stat", default="best", choices=("best", "median"))
    p.add_argument("--passes", type=int, default=2, help="passes of the per-node checks (best kept)")
    p.add_argument("--slow-ratio", type=float, default=0.7)
    p.add_argument("--deadline", type=float, default=0.0, help="epoch seconds after which no round starts")
    p.add_argument("--json", required=True)
    p.add_argument("--matmul-n", type=int, default=0, help="matmul side (default 8192 on GPU, 512 on CPU)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    return p


class _Worker(NodeRank):
    """The job's stages on this rank: the per-node checks, the pair rounds, the report (rank 0's)."""

    # per-node checks -----------------------------------------------------
    def _compute_measure(self) -> Callable[[], dict[str, float]] | None:
        """One compute measurement on this rank (GPU: its own device; CPU: the node's first rank only)."""
        torch = self.torch
        if self.cuda:
            from torchhpc.bench import gpu

            n = self.args.matmul_n or 8192
            return lambda: {"matmul": gpu._matmul(n, "bf16"), "copy": gpu._copy_bw(1 << 30)["d2d"]}
        if self.rank != self.leader[self.node]:
            return None
        n = self.args.matmul_n or 512  # short calls, many of them: the best one counts
        a, b = torch.randn(n, n), torch.randn(n, n)
        mm = self._call_seconds(lambda: torch.mm(a, b))
        return lambda: {"matmul": 2 * n**3 / mm() / 1e9}

    def node_checks(self) -> dict[str, dict[str, float | None]]:
        """``--passes`` passes; per pass the best matmul and the median intra-node call; the best pass counts."""
        dist, torch = self.dist, self.torch
        slots, slot = (len(self.nodes), self.nodes.index(self.node)) if self.shared else (1, 0)
        multi = any(len(r) > 1 for r in self.ranks_of.values())
        groups = {n: dist.new_group(self.ranks_of[n]) for n in self.nodes} if multi else {}
        mine: dict[str, float] = {}
        threads = torch.get_num_threads()
        if self.shared and not self.cuda:
            # Nodes sharing one machine's cores: a multi-threaded GEMM waits for its slowest
            # thread, and an oversubscribed core makes that a lottery. One thread is fair.
            torch.set_num_threads(1)
        compute = self._compute_measure()
        intra = None
        if len(self.ranks_of[self.node]) > 1:
            world = len(self.ranks_of[self.node])
            size = min(self.size, INTRA_BYTES)
            buf = torch.ones(max(1, size // 4), dtype=torch.float32, device=self.ctx.device)
            call = self._call_seconds(lambda: dist.all_reduce(buf, group=groups[self.node]))
            intra = lambda: size / call() / 1e9 * 2 * (world - 1) / world  # noqa: E731
        try:
            for _ in range(self.args.passes):
                for figs in self._lockstep(compute, 1 + (2 if self.cuda else 5), slot, slots)[1:]:
                    for k, v in figs.items():
                        mine[k] = max(mine.get(k, v), v)
                        self.samples.setdefault(k, []).append(round(v, 4))
                got = self._lockstep(intra, self.args.warmup + self.args.iters, slot, slots)[self.args.warmup:]
                if got and self.rank == self.leader[self.node]:
                    mine["intra-node"] = max(mine.get("intra-node", 0.0), self.pick(got, higher=True))
                    self.samples.setdefault("intra-node", []).append([round(v, 4) for v in got])
        finally:
            torch.set_num_threads(threads)
        everyone: list[Any] = [None] * self.ctx.world_size
        dist.all_gather_object(everyone, (self.node, mine, self.rank, self.samples))
        figures: dict[str, dict[str, float | None]] = {n: {} for n in self.nodes}
        self.all_samples = {f"{node} rank {rank}": smp for node, _, rank, smp in everyone if smp}
        for node, figs, _, _ in everyone:
            for k, v in figs.items():
                old = figures[node].get(k)
                figures[node][k] = v if old is None else min(old, v)  # the slowest GPU names the node
        for g in groups.values():
            if g != dist.GroupMember.NON_GROUP_MEMBER:
                dist.destroy_process_group(g)
        return figures

    # pairs -------------------------------------------------------------------
    def _pair(self, group: Any, slot: int = 0, slots: int = 1) -> dict[str, Any]:
        """Every rank calls this (in step); the two ends of a pair pass their group, the others None.

        ``slots`` > 1: the pairs of the round take turns call by call (nodes sharing one machine).
        """
        torch, dist = self.torch, self.dist
        buf = torch.ones(max(1, self.size // 4), dtype=torch.float32, device=self.ctx.device)
        call = self._call_seconds(lambda: dist.all_reduce(buf, group=group))
        # Warm-up calls (connections, buffers) need not move --size bytes: a slow link would
        # spend seconds on each.
        small = buf[: max(1, min(buf.numel(), WARMUP_BYTES // 4))]
        warm = self._call_seconds(lambda: dist.all_reduce(small, group=group))
        errors: list[str] = []
        done = [0]

        def measure() -> float | None:
            if errors:
                return None
            try:
                done[0] += 1
                return warm() if done[0] <= self.args.warmup else call()
            except Exception as e:  # a broken link is a result (FAIL), not the end of the run
                errors.append(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
                return None

        got = self._lockstep(measure if group is not None else None, self.args.warmup + self.args.iters,
                             slot, slots, min_steps=self.args.warmup + 1, cap=PAIR_SECONDS)
        if group is None:
            return {}
        if errors:
            return {"busbw": None, "error": errors[0]}
        try:
            buf.fill_(1.0)
            dist.all_reduce(buf, group=group)
            self.sync()
            wrong = int((buf != 2.0).sum().item())
        except Exception as e:
            return {"busbw": None, "error": f"{type(e).__name__}: {e}"}
        if wrong:
            return {"busbw": None, "error": f"{wrong} wrong values"}
        times = [t for t in got[self.args.warmup:] if t is not None]
        # 2 ranks: busbw = algbw * 2(n-1)/n = algbw (nccl-tests' all_reduce factor)
        return {"busbw": self.size / self.pick(times, higher=False) / 1e9,
                "median_busbw": self.size / statistics.median(times) / 1e9, "times": [round(t, 6) for t in times]}

    def run_round(self, pairs: list[plan.Pair], stage: str, label: str, ref: plan.Pair | None = None) -> None:
        """The pairs side by side (plus the reference pair, when given), one record per pair."""
        dist = self.dist
        t0 = time.time()
        timeout = timedelta(seconds=max(60.0, self.args.deadline - time.time()) if self.args.deadline else 600.0)
        everything = [*pairs, *([ref] if ref else [])]
        groups = {p: dist.new_group([self.leader[p[0]], self.leader[p[1]]], timeout=timeout) for p in everything}
        mine = next((p for p in everything if self.node in p), None) if self.rank == self.leader[self.node] else None
        # Pairs of a round run side by side; on nodes sharing one machine they would only fight
        # for its cores, so there they take turns, call by call (the same rounds, the same plan).
        slots = len(everything) if self.shared else 1
        slot = everything.index(mine) if mine is not None and self.shared else 0
        res = self._pair(groups[mine] if mine is not None else None, slot, slots)
        result = (mine, res) if mine is not None and self.node == mine[0] else None  # the first node reports
        everyone: list[Any] = [None] * self.ctx.world_size
        dist.all_gather_object(everyone, result)
        for g in groups.values():
            if g != dist.GroupMember.NON_GROUP_MEMBER:
                dist.destroy_process_group(g)
        took = time.time() - t0
        got = {tuple(item[0]): item[1] for item in everyone if item is not None}
        ref_bw = got.get(ref, {}).get("busbw") if ref else None
        for p in everything:
            res = got.get(p, {"busbw": None, "error": "no result"})
            is_ref = p == ref
            self.pairs.append({"pair": list(p), "stage": "reference" if is_ref else stage, **res,
                               **({} if is_ref or not ref else {"ref": ref_bw})})
            fig = f"{res['busbw']:.3f} GB/s" if res["busbw"] is not None else f"FAILED ({res['error']})"
            self.say(f"pair {plan.pair_key(p)} {fig}  [{label}{', reference' if is_ref else ''}, {took:.1f}s]")
        self.last_round = took

    def _go(self, pairs: list[plan.Pair]) -> bool:
        """Rank 0 decides whether the next round fits before the deadline; everyone follows."""
        ok = [True]
        if self.rank == 0 and self.args.deadline:
            need = 1.25 * max(getattr(self, "last_round", plan.MIN_ROUND_SECONDS), plan.MIN_ROUND_SECONDS)
            ok[0] = time.time() + need < self.args.deadline
        self.dist.broadcast_object_list(ok, src=0)
        if not ok[0]:
            self.skipped.append([plan.pair_key(p) for p in pairs])
        return bool(ok[0])

    def _decide(self, what: str, ring: list[plan.Pair]) -> Any:
        """Rank 0 plans the next rounds from the results so far; every rank gets the same plan."""
        box: list[Any] = [None]
        if self.rank == 0:
            scores, _ = plan.pair_scores(self.pairs, ring)
            bad, good = plan.suspects(self.nodes, scores, self.args.slow_ratio)
            limit = plan.max_confirm_rounds(len(self.nodes)) + 1
            if what == "retry":
                again = plan.remeasure_pairs(bad, good, scores, self.args.slow_ratio,
                                             [tuple(m["pair"]) for m in self.pairs if m["stage"] == "retry"])
                passed = [p for p in ring if p not in again]
                box[0] = plan.retry_rounds(again, good, passed, limit)
            else:
                rounds = plan.confirm_rounds(bad, good, scores, len(self.nodes))
                box[0] = (bad, [(r, plan.reference_pair(r, good)) for r in rounds])
        self.dist.broadcast_object_list(box, src=0)
        return box[0]

    def run(self) -> dict[str, Any]:
        self.say(f"{counted(len(self.nodes), 'node')} {', '.join(self.nodes)}; {self.ctx.world_size} ranks, "
                 f"{self.ctx.backend}" + ("; the nodes share one kernel (namespaces on one machine)"
                                          if self.shared else ""))
        checks = [("matmul", "TFLOP/s" if self.cuda else "GFLOP/s"), ("copy", "GB/s"), ("intra-node", "GB/s")]
        t0 = time.time()
        figures = self.node_checks()
        took = time.time() - t0
        ring = plan.ring_pairs(self.nodes)
        rounds = plan.rounds_of(ring)
        for _ in range(NODE_RETRIES):  # a slow check is measured again before it counts; the best stays
            again = [False]
            if self.rank == 0:
                slow = any(r.verdict != plan.PASS for r in plan.node_rows(self.nodes, figures, checks, {},
                                                                         self.args.slow_ratio))
                # only when the pairs still fit in the budget afterwards
                pairs_need = (len(rounds) + plan.max_confirm_rounds(len(self.nodes))) * 2 * PAIR_SECONDS
                fits = not self.args.deadline or time.time() + took + pairs_need < self.args.deadline
                again[0] = slow and fits
            self.dist.broadcast_object_list(again, src=0)
            if not again[0]:
                break
            self.say("a per-node check is slow: measuring every node again")
            for n, figs in self.node_checks().items():
                for k, v in figs.items():
                    old = figures[n].get(k)
                    figures[n][k] = v if old is None or (v is not None and v > old) else old
        for n in self.nodes:
            self.say(f"node {n} " + ", ".join(f"{k} {v:.3g}" for k, v in figures[n].items() if v is not None))
        for i, r in enumerate(rounds, 1):
            if self._go(r):
                self.run_round(r, "ring", f"ring round {i}/{len(rounds)}")
        bad, confirm = self._decide("confirm", ring)
        if bad:
            self.say(f"suspects {', '.join(bad)}: {counted(sum(len(r) for r, _ in confirm), 'confirmation pair')} "
                     "with known-good nodes")
        for i, (r, ref) in enumerate(confirm, 1):
            pairs = [(p[0], p[1]) for p in r]
            if self._go(pairs):
                self.run_round(pairs, "confirm", f"confirmation {i}/{len(confirm)}", tuple(ref) if ref else None)
        # Then a slow pair between two good nodes, and each suspect still slow, runs again beside a
        # reference pair of good nodes: a busy moment slows both alike, a slow link only its own.
        for _ in range(2):  # the second time: the slow pairs of a suspect the first one cleared
            retry = self._decide("retry", ring)
            for i, (r, ref) in enumerate(retry, 1):
                pairs = [(p[0], p[1]) for p in r]
                if self._go(pairs):
                    self.run_round(pairs, "retry", f"re-measure {i}/{len(retry)}", tuple(ref) if ref else None)
        scores, _ = plan.pair_scores(self.pairs, ring)
        rows = plan.node_rows(self.nodes, figures, checks, scores, self.args.slow_ratio)
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
            "stat": self.args.stat,
            "slow_ratio": self.args.slow_ratio,
            "figures": figures,
            "samples": getattr(self, "all_samples", {}),
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
