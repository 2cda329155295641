"""What a checkpoint costs the training loop: the old helper, ``save``, ``save(blocking=False)``.

A model and Adam state of ``--state-gib`` GiB in all (parameters and both moments: 12 bytes
a parameter) on each of ``--ranks`` local ranks (``torchhpc run -n R``), replicated as under
DDP. Each round times, in an order that rotates from round to round:

* ``legacy``: the helper before DCP (``tests/legacy_checkpoint.save``, no longer in the package: rank 0
  ``torch.save``\\ s the whole state to one file, fsynced);
* ``sync``: ``checkpoint.save(...)``: every rank writes its part (DCP), fsynced, published;
* ``async``: ``checkpoint.save(..., blocking=False)``: the pause (the copy into host
  buffers) and, separately, the time until the save is complete (``handle.wait()``);
* ``memory``: ``checkpoint.save(..., tier="memory")``: the pause (this node's copy into shared memory)
  and, separately, the time until the peer copy is complete (another node's memory holds each rank's
  part). Each rank plays a node of its own (``TORCHHPC_NODE_NAME``), so the peer copy crosses ranks as
  between real nodes (over gloo on this machine's loopback).

Then the memory tier in a training loop (``--loop-steps`` steps of ``--step-s`` seconds of compute and an
all_reduce each, as DDP's): the same steps with no save and with a memory save every step, interleaved,
and where the extra time goes: the save's pause, the wait for the previous peer copy (the next save waits
for it), and the rest (compute slowed by the copy's thread).

Each figure is the slowest rank's (training waits for it at its next collective). One
untimed save of each kind first (the async one allocates the host buffers it then reuses:
its pause is printed apart). Then ``--rss-saves`` async saves back to back into
``--rss-dir`` (tmpfs by default: the question is host memory, not the disk's speed) with
each rank's resident memory after the 5th and the last. Medians, ratios and the load
average are printed; ``--json PATH`` writes them with the keys ``legacy_blocking_s``,
``sync_blocking_s``, ``async_blocking_s``, ``async_total_s``.

``--device cuda`` keeps the state on each rank's GPU (NCCL, one rank per GPU: ``--ranks 1`` on a
one-GPU machine); the pause is then the copy into pinned host buffers.

Run: ``.venv/bin/python benchmarks/checkpoint_cost.py --state-gib 1 [--rounds 3] [--json out.json]``.
No timed assertions: the figures go to docs/training.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

KINDS = ("legacy", "sync", "async", "memory")


def rss_gib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 2**20
    return 0.0


def build(gib: float, device: Any) -> tuple[Any, Any]:
    """Linear layers of 12 bytes a parameter (weight, Adam's two moments) adding up to ``gib`` GiB."""
    import torch

    params = int(gib * 2**30 / 12)
    layers = max(1, -(-params // 4096**2))  # layers of at most 4096 x 4096, as many as it takes
    width = int((params / layers) ** 0.5)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)]).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for prm in model.parameters():
        prm.grad = torch.full_like(prm, 1e-3)
    opt.step()  # Adam's moments now exist: the whole state is there to save
    opt.zero_grad(set_to_none=True)
    return model, opt


def rank_program(a: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    import torchhpc.dist as thd
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: tests/legacy_checkpoint.py
    from tests import legacy_checkpoint

    from torchhpc.dist import checkpoint

    # each rank a node of its own for the memory tier: its peer copy then crosses ranks, as between nodes
    os.environ["TORCHHPC_NODE_NAME"] = f"rank{os.environ.get('RANK', '0')}"
    ctx = thd.init(single_group=True, device=a.device if a.device == "cpu" else None)  # a group also for 1 rank
    torch.set_num_threads(1)
    model, opt = build(a.state_gib, ctx.device)
    state_gib = (sum(p.numel() for p in model.parameters()) * 12) / 2**30
    base = Path(a.dir)

    def slowest(x: float) -> float:
        t = torch.tensor([x], dtype=torch.float64, device=ctx.device)  # NCCL reduces on the GPU
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    def one(kind: str, step: int) -> tuple[float, float]:
        where = base / kind
        dist.barrier()
        t0 = time.perf_counter()
        if kind == "legacy":
            legacy_checkpoint.save(where, step=step, model=model, optimizer=opt)
            t1 = t2 = time.perf_counter()
        elif kind == "sync":
            checkpoint.save(where, step=step, model=model, optimizer=opt, keep=1)
            t1 = t2 = time.perf_counter()
        elif kind == "memory":
            checkpoint.save(where, step=step, model=model, optimizer=opt, tier="memory")
            t1 = time.perf_counter()
            checkpoint.default().memory().wait()  # the peer copy is complete
            t2 = time.perf_counter()
        else:
            handle = checkpoint.save(where, step=step, model=model, optimizer=opt, keep=1, blocking=False)
            t1 = time.perf_counter()
            handle.wait()
            t2 = time.perf_counter()
        blocking, total = slowest(t1 - t0), slowest(t2 - t0)
        if kind == "legacy" and ctx.rank == 0:  # the old helper kept 3; one is enough here
            for old in sorted(where.glob("ckpt-*.pt"))[:-1]:
                old.unlink()
        return blocking, total

    rows: dict[str, list[float]] = {"legacy": [], "sync": [], "async": [], "async_total": [], "memory": [],
                                    "memory_total": []}
    first = {kind: one(kind, 0)[0] for kind in KINDS}  # untimed warm-up (the async one allocates its buffers)
    if ctx.rank == 0:
        print(f"# state {state_gib:.2f} GiB on each of {ctx.world_size} ranks ({ctx.device}, replicated as under DDP); "
              f"first async pause {first['async']:.3f} s (allocating the host buffers)", flush=True)
        print(f"# {'round':>5} {'legacy (s)':>11} {'sync (s)':>9} {'async (s)':>10} {'async done (s)':>15} "
              f"{'memory (s)':>11} {'peer done (s)':>14}", flush=True)
    for r in range(a.rounds):
        order = KINDS[r % len(KINDS):] + KINDS[: r % len(KINDS)]
        for kind in order:
            blocking, total = one(kind, r + 1)
            rows[kind].append(blocking)
            if kind in ("async", "memory"):
                rows[f"{kind}_total"].append(total)
        if ctx.rank == 0:
            print(f"  {r + 1:>5} {rows['legacy'][-1]:>11.3f} {rows['sync'][-1]:>9.3f} {rows['async'][-1]:>10.3f} "
                  f"{rows['async_total'][-1]:>15.3f} {rows['memory'][-1]:>11.3f} {rows['memory_total'][-1]:>14.3f}",
                  flush=True)
    loop = memory_loop(a, ctx, model, opt, base / "loop", slowest) if a.loop_steps else {}
    rss: dict[int, float] = {}
    rss_dir = Path(a.rss_dir) / f"rss-{os.getpid() if ctx.rank == 0 else 0}"
    rss_dir = Path(thd.all_gather_objects(str(rss_dir))[0])
    for i in range(1, a.rss_saves + 1):
        checkpoint.save(rss_dir, step=i, model=model, optimizer=opt, keep=1, blocking=False).wait()
        if i in (5, a.rss_saves):
            rss[i] = max(thd.all_gather_objects(rss_gib()))
    dist.barrier()
    if ctx.rank == 0:
        shutil.rmtree(rss_dir, ignore_errors=True)
        med = {k: statistics.median(v) for k, v in rows.items()}
        print(f"# median: legacy {med['legacy']:.3f} s, sync {med['sync']:.3f} s, async pause {med['async']:.3f} s, "
              f"async complete {med['async_total']:.3f} s", flush=True)
        print(f"# async pause / sync = {med['async'] / med['sync']:.3f}; sync / legacy = {med['sync'] / med['legacy']:.3f}; "
              f"async complete / sync = {med['async_total'] / med['sync']:.3f}", flush=True)
        print(f"# memory tier: pause {med['memory']:.3f} s ({med['memory'] / med['async']:.2f}x the async disk pause), "
              f"peer copy complete {med['memory_total']:.3f} s after the call", flush=True)
        if loop:
            print(f"# loop of {a.loop_steps} steps of {a.step_s:g} s: {loop['none_step_s']:.3f} s a step with no save, "
                  f"{loop['memory_step_s']:.3f} s with a memory save every step (x{loop['slowdown']:.3f}); the extra "
                  f"{loop['extra_s']:.3f} s a step: pause {loop['pause_s']:.3f} s, waiting for the previous peer copy "
                  f"{loop['copy_wait_s']:.3f} s, the rest {loop['rest_s']:.3f} s (compute beside the copy's thread)",
                  flush=True)
        lo, hi = rss.get(5, 0.0), rss.get(a.rss_saves, 0.0)
        print(f"# host memory (largest rank's RSS): {lo:.2f} GiB after 5 async saves, {hi:.2f} GiB after "
              f"{a.rss_saves} ({(hi / lo - 1) * 100 if lo else 0:+.1f} %)", flush=True)
        load = os.getloadavg()
        print(f"# load average: {' '.join(f'{x:.2f}' for x in load)}", flush=True)
        if a.json:
            Path(a.json).write_text(json.dumps({
                "state_gib": round(state_gib, 3), "ranks": ctx.world_size, "rounds": a.rounds, "device": str(ctx.device),
                "legacy_blocking_s": med["legacy"], "sync_blocking_s": med["sync"],
                "async_blocking_s": med["async"], "async_total_s": med["async_total"],
                "memory_blocking_s": med["memory"], "memory_peer_done_s": med["memory_total"], "loop": loop,
                "first_async_blocking_s": first["async"], "per_round": rows,
                "rss_gib_after_5": lo, f"rss_gib_after_{a.rss_saves}": hi, "rss_saves": a.rss_saves,
                "loadavg": list(load),
            }, indent=1) + "\n")
    thd.cleanup()


def memory_loop(a: argparse.Namespace, ctx: Any, model: Any, opt: Any, where: Path, slowest: Any) -> dict[str, float]:
    """Steps of ``a.step_s`` seconds of compute (a matmul loop timed once) and a small all_reduce, with no save
    and with a memory save every step, in alternating blocks; medians of the slowest rank's step times."""
    import torch
    import torch.distributed as dist

    from torchhpc.dist import checkpoint

    x = torch.randn(512, 512)
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < 0.5:
        x = torch.tanh(x @ x)
        n += 1
    per_s = int(n / (time.perf_counter() - t0))
    reps = int(slowest(per_s * a.step_s))  # the same work on every rank: the fastest rank's calibration waits

    def step() -> None:
        y = x
        for _ in range(reps):
            y = torch.tanh(y @ y)
        dist.all_reduce(torch.ones(1))

    times: dict[str, list[float]] = {"none": [], "memory": [], "pause": [], "wait": []}
    blocks = 4
    for b in range(2 * blocks):
        kind = ("none", "memory")[b % 2]
        for i in range(max(1, a.loop_steps // blocks)):
            dist.barrier()
            t0 = time.perf_counter()
            step()
            if kind == "memory":
                t1 = time.perf_counter()
                checkpoint.default().memory().wait()  # what the save would wait for first: the previous peer copy
                t2 = time.perf_counter()
                checkpoint.save(where, step=b * 1000 + i, model=model, optimizer=opt, tier="memory")
                t3 = time.perf_counter()
                times["wait"].append(slowest(t2 - t1))
                times["pause"].append(slowest(t3 - t2))
            times[kind].append(slowest(time.perf_counter() - t0))
    checkpoint.default().memory().wait()
    med = {k: statistics.median(v) for k, v in times.items()}
    extra = med["memory"] - med["none"]
    return {"none_step_s": med["none"], "memory_step_s": med["memory"], "slowdown": med["memory"] / med["none"],
            "extra_s": extra, "pause_s": med["pause"], "copy_wait_s": med["wait"],
            "rest_s": extra - med["pause"] - med["wait"], "steps": len(times["memory"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--state-gib", type=float, required=True, help="model + Adam state per rank, GiB")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                    help="where the state lives: cuda puts it on each rank's GPU (NCCL; one rank per GPU)")
    ap.add_argument("--json", default=None, metavar="PATH")
    ap.add_argument("--dir", default=None, help="where the timed checkpoints go (default: a new temporary directory)")
    ap.add_argument("--rss-dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None)
    ap.add_argument("--rss-saves", type=int, default=50)
    ap.add_argument("--loop-steps", type=int, default=16, help="steps of the memory tier's training loop (0: none)")
    ap.add_argument("--step-s", type=float, default=2.0, help="compute seconds of each loop step (default 2)")
    ap.add_argument("--rank-program", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rank_program:
        rank_program(a)
        return
    own = a.dir is None
    where = tempfile.mkdtemp(prefix="checkpoint-cost-") if own else a.dir  # outside the checkout
    argv = [sys.executable, "-m", "torchhpc", "run", "-n", str(a.ranks), "--", sys.executable, __file__, "--rank-program",
            "--state-gib", str(a.state_gib), "--device", a.device, "--rounds", str(a.rounds), "--dir", str(where),
            "--rss-dir", str(a.rss_dir or where), "--rss-saves", str(a.rss_saves), "--loop-steps", str(a.loop_steps),
            "--step-s", str(a.step_s)]
    if a.json:
        argv += ["--json", os.path.abspath(a.json)]
    try:
        code = subprocess.run(argv).returncode
    finally:
        if own:
            shutil.rmtree(where, ignore_errors=True)
    raise SystemExit(code)


if __name__ == "__main__":
    main()
