"""Timing and correctness, by nccl-tests' method, over ``torch.distributed``.

For every size: untimed warm-up calls, a barrier, ``-n`` back-to-back timed
calls (no barrier between them: a barrier per call measures latency to the
barrier, not the collective, and reads up to 2x high below 16 MiB), the mean
time per call combined over ranks as ``-a`` says, then -- after timing, so it
cannot perturb it -- one call on freshly written data whose result every rank
checks element by element (the ``#wrong`` column, summed over ranks).

On CUDA the clock is CUDA events on the current stream (torch makes that
stream wait for the NCCL stream when a call returns), read after a
synchronize; on CPU (gloo, whose calls block) it is the host's
``perf_counter``. Per-call stamps give the median beside the mean.
"""

from __future__ import annotations

import os
import socket
import statistics
import time
from collections.abc import Callable
from typing import Any

from torchhpc.bench.collectives import DTYPES, Collective, Layout, bandwidth, get_collective
from torchhpc.bench.config import BenchConfig
from torchhpc.bench.data import PATTERN_MAX, expected, fill_send
from torchhpc.bench.report import (
    BenchResult,
    CollectiveResult,
    Measure,
    RankInfo,
    Row,
    footer_lines,
    header_lines,
    row_line,
    table_header,
)
from torchhpc.errors import UsageError

__all__ = ["run"]

Emit = Callable[[str], None]


def _barrier(ctx: Any) -> None:
    import torch.distributed as dist

    if ctx.backend == "nccl":
        dist.barrier(device_ids=[ctx.device.index or 0])
    else:
        dist.barrier()


def _device_text(device: Any) -> str:
    import torch

    if device.type != "cuda":
        return "cpu"
    idx = device.index or 0
    props = torch.cuda.get_device_properties(idx)
    bus = getattr(props, "pci_bus_id", None)
    busid = f" [0x{bus:02x}]" if isinstance(bus, int) else ""
    return f"{idx}{busid} {props.name}"


def _rank_infos(ctx: Any) -> list[RankInfo]:
    from torchhpc.dist.sync import all_gather_objects  # not dist.all_gather_object: it needs numpy

    mine = RankInfo(ctx.rank, socket.gethostname(), os.getpid(), _device_text(ctx.device))
    return [g for g in all_gather_objects(mine) if g is not None]


class _Case:
    """Buffers and the one call for a (collective, size, placement)."""

    def __init__(self, coll: Collective, layout: Layout, in_place: bool, cfg: BenchConfig, ctx: Any) -> None:
        import torch
        import torch.distributed as dist

        self.coll, self.layout, self.in_place, self.ctx = coll, layout, in_place, ctx
        self.count = count = layout.count
        n, r = ctx.world_size, ctx.rank
        dtype = getattr(torch, DTYPES[cfg.dtype][0])
        dev = ctx.device
        name = coll.name
        op = _reduce_op(cfg.op, ctx.backend)
        root = cfg.root
        c = count
        if name in ("all_reduce", "broadcast", "reduce"):
            self.send = torch.empty(c, dtype=dtype, device=dev)
            self.recv = self.send if in_place else torch.empty(c, dtype=dtype, device=dev)
        elif name == "all_gather":
            self.recv = torch.empty(c * n, dtype=dtype, device=dev)
            self.send = self.recv.narrow(0, r * c, c) if in_place else torch.empty(c, dtype=dtype, device=dev)
        elif name == "reduce_scatter":
            self.send = torch.empty(c * n, dtype=dtype, device=dev)
            self.recv = self.send.narrow(0, r * c, c) if in_place else torch.empty(c, dtype=dtype, device=dev)
        else:  # all_to_all, sendrecv: out-of-place only
            width = c * n if name == "all_to_all" else c
            self.send = torch.empty(width, dtype=dtype, device=dev)
            self.recv = torch.empty(width, dtype=dtype, device=dev)
        send, recv = self.send, self.recv
        nxt, prv = (r + 1) % n, (r - 1) % n

        def sendrecv() -> None:
            reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, send, nxt), dist.P2POp(dist.irecv, recv, prv)])
            for q in reqs:
                q.wait()

        # Newer torch names them *_single (the *_tensor names warn); older releases have only *_tensor.
        gather = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
        scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
        # torch's all_reduce/broadcast/reduce have one buffer: out-of-place is copy-then-collective on the
        # output (broadcast: only the root has an input to copy), as a torch program writes it.
        copy_in = send is not recv and (name != "broadcast" or r == root)

        def into_recv(collective: Callable[[], Any]) -> Callable[[], Any]:
            if not copy_in:
                return collective

            def call() -> Any:
                recv.copy_(send)
                return collective()
            return call

        calls: dict[str, Callable[[], Any]] = {
            "all_reduce": into_recv(lambda: dist.all_reduce(recv, op=op)),
            "broadcast": into_recv(lambda: dist.broadcast(recv, src=root)),
            "reduce": into_recv(lambda: dist.reduce(recv, dst=root, op=op)),
            "all_gather": lambda: gather(recv, send),
            "reduce_scatter": lambda: scatter(recv, send, op=op),
            "all_to_all": lambda: dist.all_to_all_single(recv, send),
            "sendrecv": sendrecv,
        }
        self.call = calls[name]

    def prepare(self, cfg: BenchConfig) -> None:
        """Write the check pattern; timing starts from it too (ordinary small numbers, never NaN)."""
        fill_send(self.coll.name, self.send, self.recv, self.count, cfg.op, cfg.root,
                  self.ctx.rank, self.ctx.world_size, self.in_place)

    def check(self, cfg: BenchConfig) -> int:
        """Wrong elements on this rank after one fresh call (0 where this rank has no result)."""
        import torch

        self.prepare(cfg)
        self.call()
        if self.ctx.device.type == "cuda":
            torch.cuda.synchronize(self.ctx.device)
        want = expected(self.coll.name, self.count, cfg.op, cfg.root, self.ctx.rank, self.ctx.world_size,
                        self.recv.dtype, self.recv.device)
        if want is None:
            return 0
        got = self.recv
        if cfg.corrupt_rank == self.ctx.rank and got.numel():
            got = got.clone()
            got.view(-1)[0] = -got.view(-1)[0] - 1  # the test hook: a result no collective would produce
        return _count_wrong(got, want, cfg.op, self.ctx.world_size)


def _reduce_op(op: str, backend: str) -> Any:
    import torch.distributed as dist

    if op == "avg" and backend != "nccl":
        raise UsageError(
            f"-o avg is not supported by the {backend} backend",
            "ReduceOp.AVG exists only in NCCL; use -o sum on CPU/gloo",
        )
    return {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
            "max": dist.ReduceOp.MAX, "avg": getattr(dist.ReduceOp, "AVG", None)}[op]


def _count_wrong(got: Any, want: Any, op: str, world: int) -> int:
    """Elements of ``got`` that differ from ``want`` beyond what rounding in ``got``'s dtype explains.

    The pattern's values are small integers, so min/max/prod and every sum
    whose partial sums stay exactly representable (4 n <= 2^mantissa bits:
    256 in bfloat16, 2048 in half) must match exactly; larger sums may round
    once per addition, up to (n - 1) eps / 2 of the result.
    """
    import torch

    if not got.dtype.is_floating_point:
        tol = 1.0 if op == "avg" else 0.0
        diff = (got.to(torch.float64) - want.to(torch.float64)).abs()
        return int((diff > tol).sum().item())
    eps = float(torch.finfo(got.dtype).eps)
    rel = 0.0
    if op in ("sum", "avg") and PATTERN_MAX * world > 2 / eps:
        rel = (world - 1) * eps / 2
    if op == "avg":
        rel += 2 * eps
    want64 = want.to(got.dtype).to(torch.float64)
    got64 = got.to(torch.float64)
    bad = ((got64 - want64).abs() > rel * want64.abs()) | torch.isnan(got64)
    return int(bad.sum().item())


def _time_calls(call: Callable[[], Any], iters: int, device: Any) -> tuple[float, float]:
    """(mean, median) seconds per call over ``iters`` back-to-back calls."""
    if device.type == "cuda":
        import torch

        events = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
        events[0].record()
        for i in range(iters):
            call()
            events[i + 1].record()
        events[-1].synchronize()
        per = [events[i].elapsed_time(events[i + 1]) / 1e3 for i in range(iters)]
        total = events[0].elapsed_time(events[-1]) / 1e3
    else:
        clock = time.perf_counter
        stamps = [0.0] * (iters + 1)
        stamps[0] = clock()
        for i in range(iters):
            call()
            stamps[i + 1] = clock()
        per = [b - a for a, b in zip(stamps, stamps[1:])]
        total = stamps[-1] - stamps[0]
    return total / iters, statistics.median(per)


def _combine(ctx: Any, values: list[float], mode: int) -> list[float]:
    """Combine per-rank times as nccl-tests' ``-a``: 0 rank 0, 1 average, 2 minimum, 3 maximum."""
    import torch
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64, device=ctx.device)
    if mode == 0:
        dist.broadcast(t, src=0)
    else:
        op = {1: dist.ReduceOp.SUM, 2: dist.ReduceOp.MIN, 3: dist.ReduceOp.MAX}[mode]
        dist.all_reduce(t, op=op)
        if mode == 1:
            t /= ctx.world_size
    return [float(x) for x in t.tolist()]


def _sum_int(ctx: Any, value: int) -> int:
    import torch
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.int64, device=ctx.device)
    dist.all_reduce(t)
    return int(t.item())


def measure(case: _Case, cfg: BenchConfig, ctx: Any) -> Measure:
    case.prepare(cfg)
    for _ in range(cfg.warmup):
        case.call()
    if ctx.device.type == "cuda":
        import torch

        torch.cuda.synchronize(ctx.device)
    _barrier(ctx)
    mean_s, median_s = _time_calls(case.call, cfg.iters, ctx.device)
    mean_s, median_s = _combine(ctx, [mean_s, median_s], cfg.average)
    wrong = _sum_int(ctx, case.check(cfg)) if cfg.check else None
    algbw, busbw = bandwidth(case.coll, case.layout, mean_s, ctx.world_size)
    return Measure(mean_s * 1e6, median_s * 1e6, algbw, busbw, wrong)


def run_collective(coll: Collective, cfg: BenchConfig, ctx: Any, emit: Emit | None = None) -> CollectiveResult:
    n = ctx.world_size
    elem = DTYPES[cfg.dtype][1]
    if coll.rooted and cfg.root >= n:
        raise UsageError(f"-r/--root {cfg.root} is not a rank (world size {n})", f"give a root below {n}")
    if coll.name == "sendrecv" and n == 1:
        # torch.distributed refuses a send to oneself (nccl-tests' 1-GPU sendrecv is a self-copy).
        raise UsageError("sendrecv needs at least 2 ranks (torch.distributed cannot send to its own rank)",
                         "start 2 or more ranks: `torchhpc run -n 2 -m torchhpc.bench sendrecv ...`")
    res = CollectiveResult(coll.name)
    seen: set[int] = set()
    for size in cfg.sizes():
        layout = coll.layout(size, n, elem)
        if layout.count == 0 or layout.count in seen:
            continue  # too small to give each rank an element, or the same call as the last size
        seen.add(layout.count)
        oop = measure(_Case(coll, layout, False, cfg, ctx), cfg, ctx) if coll.out_of_place else None
        ip = measure(_Case(coll, layout, True, cfg, ctx), cfg, ctx) if coll.in_place else None
        row = Row(
            layout.size, layout.count, cfg.dtype, cfg.op if coll.reduces else "none",
            cfg.root if coll.rooted else -1, oop, ip,
        )
        res.rows.append(row)
        if emit:
            emit(row_line(row))
    return res


def run(cfg: BenchConfig, ctx: Any, emit: Emit | None = None) -> BenchResult:
    """Run every collective of ``cfg`` on an initialised process group; ``emit`` gets rank 0's lines.

    Returns the full result on every rank (only rank 0 should print or write it).
    """
    import torch

    cfg = cfg.with_env_hooks()
    say: Emit = emit if (emit and ctx.rank == 0) else (lambda _line: None)
    ranks = _rank_infos(ctx)
    config = cfg.as_dict()
    for line in header_lines(config, ctx.world_size, ctx.backend, ranks):
        say(line)
    results = []
    for name in cfg.collective_names():
        coll = get_collective(name)
        for line in table_header(coll.name):
            say(line)
        res = run_collective(coll, cfg, ctx, say)
        for line in footer_lines(res, ctx.world_size, cfg.min_bw):
            say(line)
        results.append(res)
    return BenchResult(config, ctx.world_size, ctx.backend, ranks, results, torch_version=torch.__version__)
