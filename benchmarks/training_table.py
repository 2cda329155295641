"""Seed 003's training timing table on whatever this machine has, plus the F5/F6 ratios.

    python benchmarks/training_table.py                 # table + F5 + F6, Markdown/PNG/JSON in benchmarks/results/
    python benchmarks/training_table.py --only f6 --rounds 7

Table: single, DP (more than one GPU), DDP 1 node × N, DDP 2 nodes × N (when a
Slurm cluster is reachable); MNIST CNN and ResNet-18 (32 px) on CPUs, ResNet-50
(224 px, bf16, batch 128) on GPUs, N = visible GPUs (1 is valid: DDP is then one
rank); same global batch and samples per epoch in every column. Epoch time is the slowest rank's training time (launch and data
preparation excluded), median over interleaved rounds.

F5: ``examples/mnist_ddp.py``'s own epoch (its ``build``/``train_epoch``) ÷ a
minimal in-memory DDP loop written below, both in the same 2-rank process
group, alternating epoch by epoch. Goal ≤ 1.05.

F6: one DDP training step ÷ the same step without gradient synchronisation
(the same DDP module under ``no_sync()``), for several DDP settings (bucket size,
``gradient_as_bucket_view``, ``static_graph``, fp16 compression), interleaved
in rounds; medians and the spread of per-round ratios. Goal ≤ 1.15.

Absolute times on shared machines drift by up to 2× between runs; only ratios
measured in the same run, variants interleaved, mean anything.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
PY = sys.executable


# ============================================================ driver (no torch)


def _result(stdout: str) -> dict[str, Any]:
    m = re.findall(r"^(?:\S*:\s?)*RESULT (\{.*\})$", stdout, re.M)
    if not m:
        raise RuntimeError(f"no RESULT line in:\n{stdout[-3000:]}")
    return dict(json.loads(m[-1]))


def _run(argv: list[str], env: dict[str, str] | None = None, cwd: Path = REPO, timeout: float = 900) -> dict[str, Any]:
    cp = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if cp.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {cp.returncode}:\n{cp.stdout[-2000:]}\n{cp.stderr[-2000:]}")
    return _result(cp.stdout)


_PROBE = ("import torch; n = torch.cuda.device_count() if torch.cuda.is_available() else 0; "
          "print(n); print(torch.cuda.get_device_name(0) if n else 'CPU'); print(torch.__version__); "
          "v = torch.cuda.nccl.version() if n and hasattr(torch.cuda, 'nccl') else None; "
          "print('CUDA %s, NCCL %s' % (torch.version.cuda, '.'.join(map(str, v)) if isinstance(v, tuple) else v) if n else '')")
LABELS = {"mnist": "MNIST CNN", "resnet18": "ResNet-18 (32 px)", "resnet50": "ResNet-50 (224 px, bf16)"}


def _devices() -> tuple[str, int, str]:
    """("cuda", GPUs, "N × name, torch, CUDA, NCCL") or ("cpu", cores, "N CPU cores, torch")."""
    out = subprocess.run([PY, "-c", _PROBE], capture_output=True, text=True, check=True).stdout.split("\n")
    gpus = int(out[0] or 0)
    cores = os.cpu_count() or 1
    if gpus:
        return "cuda", gpus, f"{gpus} × {out[1]}, torch {out[2]}, {out[3]}, {cores} CPU cores"
    return "cpu", cores, f"{cores} CPU cores, torch {out[2]}"


def _cluster_env() -> dict[str, str] | None:
    try:
        from torchhpc.devcluster import load_state
    except ImportError:
        return None
    state = load_state()
    return dict(state.client_env()) if state is not None else None


def _workload(model: str, quick: bool) -> tuple[Path, list[str], int]:
    """Script, fixed arguments, and the global batch kept equal across columns."""
    if model == "mnist":
        size = "2000" if quick else "6000"
        return EXAMPLES / "mnist_ddp.py", ["--epochs", "1", "--train-size", size, "--test-size", "200"], 128
    if model == "resnet50":  # the GPU workload: ImageNet-size synthetic images, the example's GPU defaults
        samples = "512" if quick else "3840"
        return EXAMPLES / "resnet_ddp.py", ["--arch", "resnet50", "--samples", samples, "--epochs", "1", "--image-size", "224", "--warmup-steps", "3"], 128
    samples = "128" if quick else "512"
    return EXAMPLES / "resnet_ddp.py", ["--arch", "resnet18", "--samples", samples, "--epochs", "1", "--image-size", "32", "--warmup-steps", "1"], 64


def table(args: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    kind, ndev, _ = _devices()
    n = args.nproc or (ndev if kind == "cuda" else min(2, ndev))
    cluster = _cluster_env()
    cache = tempfile.mkdtemp(prefix="torchhpc-bench-cache-")
    rows: list[dict[str, Any]] = []
    for model in args.models or (["mnist", "resnet50"] if kind == "cuda" else ["mnist", "resnet18"]):
        script, fixed, gbatch = _workload(model, args.quick)
        extra = ["--cache", cache] if model == "mnist" else []
        def mode(m: str, model: str = model) -> list[str]:
            return [] if model == "mnist" else ["--mode", m]

        configs: list[tuple[str, int, int, list[str], dict[str, str] | None]] = [
            ("single", 1, 1, [PY, str(script), *fixed, *extra, *mode("single"), "--batch-size", str(gbatch)], None)
        ]
        if model != "mnist" and kind == "cuda" and ndev > 1:
            configs.append(("DP", 1, ndev, [PY, str(script), *fixed, *mode("dp"), "--batch-size", str(gbatch)], None))
        ddp_args = [str(script), *fixed, *extra, *mode("ddp")]
        configs.append(
            ("DDP", 1, n, [PY, "-m", "torchhpc", "run", "-n", str(n), *ddp_args, "--batch-size", str(gbatch // n)], None)
        )
        if cluster is not None and args.cluster:
            slurm = [PY, "-m", "torchhpc", "run", "-s", "slurm", "-N", "2", "--nproc-per-node", str(n), "--launcher", "torchrun",
                     "--output-dir", tempfile.mkdtemp(prefix="torchhpc-bench-"), "--wait"]
            configs.append(("DDP", 2, n, [*slurm, *ddp_args, "--batch-size", str(gbatch // (2 * n))], cluster))
        failed: dict[int, str] = {}
        times: dict[int, list[float]] = {i: [] for i in range(len(configs))}
        walls: dict[int, list[float]] = {i: [] for i in range(len(configs))}
        for r in range(args.table_rounds):
            order = list(range(len(configs)))
            order = order[r % len(order):] + order[: r % len(order)]  # rotate: no column always runs first
            for i in order:
                name, nodes, per, argv, env = configs[i]
                t0 = time.perf_counter()
                try:
                    res = _run(argv, env=env)
                except RuntimeError as e:
                    if env is None:
                        raise
                    # A shared dev cluster can be restarted under us: record it, keep the rest of the table.
                    failed[i] = str(e).splitlines()[-1][:200]
                    print(f"  {model:6s} {name:6s} {nodes}×{per}: FAILED ({failed[i]})", flush=True)
                    continue
                walls[i].append(time.perf_counter() - t0)
                times[i].append(res["epochs"][-1]["epoch_time_s"])
                print(f"  {model:6s} {name:6s} {nodes}×{per}: epoch {times[i][-1]:.2f}s (wall {walls[i][-1]:.1f}s)", flush=True)
        base = statistics.median(times[0])
        for i, (name, nodes, per, _, _) in enumerate(configs):
            if not times[i]:
                rows.append({"model": LABELS[model], "nodes": nodes, "per_node": per,
                             "method": name, "device": kind, "epoch_s": None, "note": f"failed: {failed.get(i, '?')}"})
                continue
            med = statistics.median(times[i])
            rows.append({
                "model": LABELS[model],
                "nodes": nodes, "per_node": per, "method": "N/A" if name == "single" else name,
                "device": kind, "epoch_s": med, "spread_s": [min(times[i]), max(times[i])],
                "wall_s": statistics.median(walls[i]), "speedup": base / med, "rounds": len(times[i]),
            })
        if cluster is None or not args.cluster:
            rows.append({"model": LABELS[model], "nodes": 2, "per_node": n, "method": "DDP",
                         "device": kind, "epoch_s": None, "note": "no Slurm cluster reachable"})
    return rows


def table_markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| Model | #Nodes | #Procs per node | Method | Epoch time (s, median) | spread (s) | Speed-up vs single | Wall incl. launch (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.get("epoch_s") is None:
            lines.append(f"| {r['model']} | N={r['nodes']} | M={r['per_node']} | {r['method']} | n/a ({r['note']}) | | | |")
            continue
        lines.append(
            f"| {r['model']} | N={r['nodes']} | M={r['per_node']} | {r['method']} | {r['epoch_s']:.2f} | "
            f"{r['spread_s'][0]:.2f}–{r['spread_s'][1]:.2f} | {r['speedup']:.2f}× | {r['wall_s']:.1f} |"
        )
    return "\n".join(lines)


def table_png(rows: list[dict[str, Any]], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    done = [r for r in rows if r.get("epoch_s") is not None]
    models = sorted({r["model"] for r in done})
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 3.6), squeeze=False)
    for ax, m in zip(axes[0], models):
        rs = [r for r in done if r["model"] == m]
        labels = [f"{r['method']}\n{r['nodes']}×{r['per_node']}" for r in rs]
        yerr = [[r["epoch_s"] - r["spread_s"][0] for r in rs], [r["spread_s"][1] - r["epoch_s"] for r in rs]]
        ax.bar(labels, [r["epoch_s"] for r in rs], yerr=yerr, capsize=4)
        ax.set_title(f"{m} ({rs[0]['device']})")
        ax.set_ylabel("epoch time (s), median")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def launch_worker(what: str, args: argparse.Namespace, out_json: Path) -> dict[str, Any]:
    argv = [PY, "-m", "torchhpc", "run", "-n", str(args.nproc or 2), str(Path(__file__).resolve()), "--worker", what,
            "--rounds", str(args.rounds), "--json", str(out_json)]
    if args.quick:
        argv.append("--quick")
    if args.f6_batch:
        argv += ["--f6-batch", str(args.f6_batch)]
    out_json.unlink(missing_ok=True)
    cp = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=1800)
    if cp.returncode != 0 and out_json.is_file():
        # Rank 0 wrote its results; a rank died afterwards (seen: gloo teardown aborting at exit).
        print(f"  warning: worker {what} exited {cp.returncode} after writing its results: {cp.stdout.strip()[-300:]}", flush=True)
    elif cp.returncode != 0:
        raise RuntimeError(f"worker {what} failed:\n{cp.stdout[-3000:]}\n{cp.stderr[-3000:]}")
    return dict(json.loads(out_json.read_text()))


# ====================================================== workers (inside ranks)


def _ratio_stats(a: list[float], b: list[float]) -> dict[str, float]:
    per_round = [x / y for x, y in zip(a, b)]
    return {"ratio": statistics.median(a) / statistics.median(b), "min": min(per_round), "max": max(per_round)}


def worker_f5(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    sys.path.insert(0, str(EXAMPLES))
    import mnist_ddp
    from models import MnistCNN

    import torchhpc.dist as thd

    ctx = thd.init()
    size = "2000" if args.quick else "6000"
    margs = mnist_ddp.parse_args(["--train-size", size, "--test-size", "200", "--cache", tempfile.gettempdir()])
    run = mnist_ddp.build(margs, ctx)
    dl_args = mnist_ddp.parse_args(["--train-size", size, "--test-size", "200", "--cache", tempfile.gettempdir(), "--dataloader"])
    dl_run = mnist_ddp.build(dl_args, ctx)

    # ---- the minimal in-memory DDP loop: what a careful person writes by hand
    x, y = run.train.tensors  # the same normalised tensors mnist_ddp trains on
    torch.manual_seed(margs.seed)
    net = MnistCNN().to(memory_format=torch.channels_last)
    # Same DDP settings as thd.wrap, so F5 isolates the script and its data path.
    model = DDP(net, gradient_as_bucket_view=True)
    opt = torch.optim.Adadelta(model.parameters(), lr=margs.lr)
    rank, world, bs = ctx.rank, ctx.world_size, margs.batch_size

    def minimal_epoch(epoch: int) -> float:
        start = time.perf_counter()
        g = torch.Generator().manual_seed(epoch)
        perm = torch.randperm(x.shape[0], generator=g)[rank::world]
        for i in range(0, perm.shape[0], bs):
            idx = perm[i : i + bs]
            xb = x.index_select(0, idx).contiguous(memory_format=torch.channels_last)
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(xb), y.index_select(0, idx)).backward()
            opt.step()
        return time.perf_counter() - start

    def slowest(seconds: float) -> float:
        return float(thd.all_reduce_max(torch.tensor([seconds], dtype=torch.float64)))

    variants: dict[str, Callable[[int], float]] = {
        "minimal": minimal_epoch,
        "mnist_ddp": lambda e: mnist_ddp.train_epoch(run)["seconds"],
        "mnist_ddp --dataloader": lambda e: mnist_ddp.train_epoch(dl_run)["seconds"],
    }
    for fn in variants.values():  # warm-up epoch each (DDP bucket rebuild, allocator)
        ctx.barrier()
        fn(0)
    times: dict[str, list[float]] = {k: [] for k in variants}
    names = list(variants)
    for r in range(args.rounds):
        for k in names[r % len(names):] + names[: r % len(names)]:
            ctx.barrier()
            times[k].append(slowest(variants[k](r + 1)))
    result = {
        "world_size": world,
        "samples_per_epoch": int(size),
        "median_epoch_s": {k: statistics.median(v) for k, v in times.items()},
        "F5": _ratio_stats(times["mnist_ddp"], times["minimal"]),
        "dataloader_vs_minimal": _ratio_stats(times["mnist_ddp --dataloader"], times["minimal"]),
        "rounds": args.rounds,
    }
    if ctx.is_main:
        Path(args.json).write_text(json.dumps(result, indent=1))
    thd.cleanup()
    return result


def worker_f6(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, str(EXAMPLES))
    from models import MnistCNN

    import torchhpc.dist as thd

    ctx = thd.init()
    bs = args.f6_batch or 64
    steps = 6 if args.quick else 20
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(bs, 1, 28, 28, generator=g).contiguous(memory_format=torch.channels_last),
                torch.randint(0, 10, (bs,), generator=g)) for _ in range(4)]

    # Baseline: the same DDP module (wrap's defaults) inside no_sync(), so both sides keep
    # their gradients in the same bucket views and differ only by the all-reduce. A plain
    # module is NOT the same step: with zero_grad(set_to_none=True) it frees and re-allocates
    # its gradients every step (4.7 MB for fc1 alone: mmap + page faults), which here cost
    # more than the whole all-reduce; it is listed for information.
    settings: dict[str, dict[str, Any] | None] = {
        "no sync (DDP no_sync())": {},
        "plain module (no DDP)": None,
        "DDP torch defaults": {"gradient_as_bucket_view": False},
        "DDP + grad_as_bucket_view": {},
        "DDP + bucket 1 MB": {"bucket_cap_mb": 1},
        "DDP + bucket 100 MB (one bucket)": {"bucket_cap_mb": 100},
        "DDP + static_graph": {"static_graph": True},
        "DDP + static_graph + bucket 100 MB": {"static_graph": True, "bucket_cap_mb": 100},
        "DDP + fp16 compression": {"compression": "fp16"},
    }
    models: dict[str, tuple[torch.nn.Module, torch.optim.Optimizer]] = {}
    for name, kw in settings.items():
        torch.manual_seed(1)
        net = MnistCNN().to(memory_format=torch.channels_last)
        model = net if kw is None else thd.wrap(net, device="cpu", **kw)
        models[name] = (model, torch.optim.Adadelta(model.parameters()))

    def run_steps(name: str, n: int) -> float:
        model, opt = models[name]
        skip_sync = model.no_sync if name.startswith("no sync") else contextlib.nullcontext
        ctx.barrier()
        start = time.perf_counter()
        for i in range(n):
            xb, yb = batches[i % len(batches)]
            opt.zero_grad(set_to_none=True)
            with skip_sync():
                F.cross_entropy(model(xb), yb).backward()
            opt.step()
        sec = time.perf_counter() - start
        return float(thd.all_reduce_max(torch.tensor([sec], dtype=torch.float64))) / n

    for name in settings:
        run_steps(name, 3)  # warm-up: DDP rebuilds its buckets after the first iteration
    names = list(settings)
    times: dict[str, list[float]] = {k: [] for k in names}
    for r in range(args.rounds):
        for k in names[r % len(names):] + names[: r % len(names)]:
            times[k].append(run_steps(k, steps))
    base = times[names[0]]
    result = {
        "world_size": ctx.world_size,
        "batch_per_rank": bs,
        "steps_per_round": steps,
        "rounds": args.rounds,
        "median_step_ms": {k: 1000 * statistics.median(v) for k, v in times.items()},
        "ratios": {k: _ratio_stats(v, base) for k, v in times.items() if k != names[0]},
    }
    if ctx.is_main:
        Path(args.json).write_text(json.dumps(result, indent=1))
    thd.cleanup()
    return result


# ====================================================================== main


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results"), help="directory for training_table.{md,png,json}")
    p.add_argument("--only", choices=("table", "f5", "f6"), action="append", help="run only these parts (repeatable)")
    p.add_argument("--models", nargs="+", default=None, choices=tuple(LABELS), help="default: mnist resnet50 on GPUs, mnist resnet18 on CPUs")
    p.add_argument("--nproc", type=int, default=None, help="ranks per node (default: GPUs, else 2)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds for F5/F6")
    p.add_argument("--table-rounds", type=int, default=2, help="interleaved rounds per table cell")
    p.add_argument("--f6-batch", type=int, default=None, help="per-rank batch for F6 (default 64, mnist_ddp's)")
    p.add_argument("--no-cluster", dest="cluster", action="store_false", help="skip the 2-node column even if a cluster is up")
    p.add_argument("--quick", action="store_true", help="tiny sizes (CI smoke run)")
    p.add_argument("--worker", choices=("f5", "f6"), help=argparse.SUPPRESS)
    p.add_argument("--json", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker == "f5":
        worker_f5(args)
        return 0
    if args.worker == "f6":
        worker_f6(args)
        return 0
    parts = args.only or ["table", "f5", "f6"]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    kind, ndev, machine = _devices()
    when = time.strftime("%Y-%m-%d")
    report: dict[str, Any] = {"parts": parts, "quick": args.quick, "machine": machine, "devices": ndev, "date": when}
    md: list[str] = ["# Training timing table (benchmarks/training_table.py)", "",
                     f"Measured on {socket.gethostname()}: {machine}, {when}.", ""]
    skipped = [p for p in parts if p in ("f5", "f6") and kind == "cuda" and ndev < (args.nproc or 2)]
    if skipped:  # F5/F6 run 2 ranks, and NCCL needs a GPU per rank
        parts = [p for p in parts if p not in skipped]
        md += [f"{'/'.join(s.upper() for s in skipped)}: skipped, they need {args.nproc or 2} GPUs and {ndev} is visible.", ""]
    if kind == "cuda" and ndev == 1:
        md += ["One GPU is visible, and one GPU is a valid table: the DDP row is one rank launched by "
               "`torchhpc run -n 1` (`thd.init()` starts no process group for one rank, so no gradient exchange), "
               "the same work as the single row through the launcher; DP needs more than one GPU and has no row.", ""]
    if "table" in parts:
        print("# table: single / DP / DDP 1 node / DDP 2 nodes", flush=True)
        rows = table(args, out)
        report["table"] = rows
        md += [table_markdown(rows), ""]
        if table_png(rows, out / "training_table.png"):
            md += ["![training table](training_table.png)", ""]
    if "f5" in parts:
        print("# F5: mnist_ddp.py epoch ÷ minimal in-memory DDP loop", flush=True)
        f5 = launch_worker("f5", args, out / "f5.json")
        report["f5"] = f5
        md += [
            f"**F5** (2 ranks, {f5['samples_per_epoch']} samples/epoch, {f5['rounds']} interleaved rounds): "
            f"mnist_ddp.py epoch ÷ minimal loop = **{f5['F5']['ratio']:.3f}** (per-round {f5['F5']['min']:.3f}–{f5['F5']['max']:.3f}); "
            f"`--dataloader` path ÷ minimal = {f5['dataloader_vs_minimal']['ratio']:.3f}. "
            "Median epoch seconds: " + ", ".join(f"{k} {v:.2f}" for k, v in f5["median_epoch_s"].items()),
            "",
        ]
    if "f6" in parts:
        print("# F6: DDP step ÷ step without gradient sync", flush=True)
        f6 = launch_worker("f6", args, out / "f6.json")
        report["f6"] = f6
        md += [
            f"**F6** (MNIST CNN, {f6['world_size']} ranks, batch {f6['batch_per_rank']}/rank, {f6['steps_per_round']} steps × {f6['rounds']} rounds; "
            f"no-sync step {f6['median_step_ms']['no sync (DDP no_sync())']:.1f} ms):",
            "",
            "| DDP setting | step (ms, median) | ÷ no sync | per-round spread |",
            "|---|---|---|---|",
        ]
        for k, v in f6["ratios"].items():
            md.append(f"| {k} | {f6['median_step_ms'][k]:.1f} | {v['ratio']:.3f} | {v['min']:.3f}–{v['max']:.3f} |")
        md.append("")
    text = "\n".join(md)
    (out / "training_table.md").write_text(text)
    (out / "training_table.json").write_text(json.dumps(report, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
