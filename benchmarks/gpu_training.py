"""The examples' training steps on one GPU against reference loops, in one process, interleaved.

    python benchmarks/gpu_training.py                          # ResNet-50 224 px batch 128 bf16 + MNIST paths
    python benchmarks/gpu_training.py --json out.json --markdown out.md
    python benchmarks/gpu_training.py --device cpu --quick     # smoke run of the harness (no figures worth reading)

ResNet: ``examples/resnet_ddp.py``'s own training step (its ``build`` — model,
data path, optimizer, precision, memory format) against a reference loop
written below the way a careful user writes it: torchvision's ResNet-50, one
fixed batch already on the device in channels_last, bf16 autocast, SGD with
momentum, ``cudnn.benchmark``. Same batch, image size, classes and
precision. Rounds alternate which one runs first; img/s per round, the median,
and the ratio example ÷ reference (goal ≥ 0.95). Memory is each one's
steady-state peak ``max_memory_allocated`` over 3 steps after its warm-up,
measured alone (the example's before the reference exists, the reference's
above what the example holds); the example's includes its synthetic dataset
held on the device (reported separately).

MNIST: ``examples/mnist_ddp.py``'s default in-memory path (whole dataset on the
device, batches sliced by index) against its ``--dataloader`` path
(``DataLoader`` over a ``TensorDataset``, batches copied per step), same
model and steps, interleaved.

Without a GPU it says so and exits 0, unless ``--device cpu`` asks for a
smoke run; ``--reference builtin`` then replaces torchvision (absent there).
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples"))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--arch", default="resnet50", choices=("resnet18", "resnet50"))
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--samples", type=int, default=None, help="the example's synthetic dataset (default 10 batches)")
    p.add_argument("--amp", action=argparse.BooleanOptionalAction, default=None, help="bf16 autocast (default: on CUDA)")
    p.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=None, help="(default: on CUDA)")
    p.add_argument("--reference", choices=("torchvision", "builtin"), default="torchvision",
                   help="the reference model (builtin only for smoke runs where torchvision is absent)")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=20, help="timed steps per round and variant")
    p.add_argument("--warmup", type=int, default=8, help="untimed steps per variant (cuDNN autotuning)")
    p.add_argument("--mnist-steps", type=int, default=100, help="timed MNIST steps per round and path (0: skip MNIST)")
    p.add_argument("--quick", action="store_true", help="tiny sizes: ResNet-18, 32 px, batch 8, 2 rounds of 2 steps")
    p.add_argument("--json", default=None, help="write the figures here")
    p.add_argument("--markdown", default=None, help="write a Markdown table here")
    p.add_argument("--profile", default=None, help="write where each loop's step time goes (torch.profiler) here")
    args = p.parse_args(argv)
    if args.quick:
        args.arch, args.image_size, args.batch_size = "resnet18", 32, 8
        args.rounds, args.steps, args.warmup, args.mnist_steps = 2, 2, 1, 3
    if args.samples is None:
        args.samples = 10 * args.batch_size
    return args


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_gib(device: Any, fn: Callable[[], None], base: int = 0) -> float | None:
    """Peak device memory (GiB) while ``fn`` runs, above ``base`` bytes; None on CPU (after running ``fn``)."""
    import torch

    if device.type != "cuda":
        fn()
        return None
    _sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    _sync(device)
    return (torch.cuda.max_memory_allocated(device) - base) / 2**30


def _repeat(fn: Callable[[], None], n: int) -> Callable[[], None]:
    def run() -> None:
        for _ in range(n):
            fn()

    return run


def _device_ms(evt: Any) -> float:
    """An event's own device time in ms (torch renamed ``self_cuda_time_total`` to ``self_device_time_total``)."""
    us = getattr(evt, "self_device_time_total", None)
    return float(us if us is not None else getattr(evt, "self_cuda_time_total", 0.0)) / 1e3


def profile(variants: dict[str, Callable[[], None]], steps: int, device: Any) -> tuple[dict[str, Any], str]:
    """Where a step's time goes, per variant: wall ms, kernel ms (sum of device time) and the top operators.

    A variant whose kernels add up to its wall time is GPU-bound: any gap to another
    variant is in the kernels it runs. Kernel time well under wall time means the GPU
    waits (on the host, a synchronisation or a copy).
    """
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    summary: dict[str, Any] = {}
    text: list[str] = []
    for name, fn in variants.items():
        _sync(device)
        with torch_profile(activities=acts) as prof:
            t0 = time.perf_counter()
            for _ in range(steps):
                fn()
            _sync(device)
            wall = (time.perf_counter() - t0) / steps * 1e3
        table = prof.key_averages()
        # Only the kernels' own rows: an operator's row counts its kernels' time again.
        kernel = sum(_device_ms(e) for e in table if str(getattr(e, "device_type", "")).endswith("CUDA")) / steps
        summary[name] = {"wall_ms_per_step": wall, "device_ms_per_step": kernel,
                         "busy_share": kernel / wall if wall else 0.0}
        sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
        try:
            top = table.table(sort_by=sort, row_limit=20)
        except Exception:  # the sort key's name moved between torch versions
            top = table.table(sort_by="self_device_time_total" if device.type == "cuda" else sort, row_limit=20)
        text += [f"## {name}: wall {wall:.2f} ms/step, device (kernels) {kernel:.2f} ms/step, over {steps} steps", top, ""]
    return summary, "\n".join(text)


def _stats(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def reference_step(args: argparse.Namespace, device: Any) -> tuple[Callable[[], None], str]:
    """The hand-written loop: torchvision ResNet, a fixed batch on the device, autocast, SGD."""
    import torch
    import torch.nn.functional as F

    if args.reference == "torchvision":
        import torchvision

        model = getattr(torchvision.models, args.arch)(weights=None, num_classes=args.num_classes)
        origin = f"torchvision {torchvision.__version__}"
    else:
        from models import build_resnet

        model, origin = build_resnet(args.arch, image_size=args.image_size, num_classes=args.num_classes, source="builtin")
    fmt = torch.channels_last if args.channels_last else torch.contiguous_format
    model = model.to(device, memory_format=fmt)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device=device, generator=g)
    x = x.contiguous(memory_format=fmt)
    y = torch.randint(0, args.num_classes, (args.batch_size,), device=device, generator=g)
    model.train()

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.amp):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()

    return step, origin


def example_step(args: argparse.Namespace, ctx: Any) -> tuple[Callable[[], None], Any]:
    """resnet_ddp.py's own step over its own loader (a new epoch when one ends)."""
    import resnet_ddp

    flags = ["--mode", "single", "--arch", args.arch, "--image-size", str(args.image_size),
             "--batch-size", str(args.batch_size), "--samples", str(args.samples), "--num-classes", str(args.num_classes),
             "--amp" if args.amp else "--no-amp", "--channels-last" if args.channels_last else "--no-channels-last"]
    run = resnet_ddp.build(resnet_ddp.parse_args(flags), ctx)
    run.model.train()
    state = {"it": iter(run.loader)}

    def step() -> None:
        try:
            xb, yb = next(state["it"])
        except StopIteration:
            state["it"] = iter(run.loader)
            xb, yb = next(state["it"])
        run.step(xb, yb)

    return step, run


def interleave(variants: dict[str, Callable[[], None]], rounds: int, steps: int, device: Any) -> dict[str, list[float]]:
    """Seconds per step of each variant, one entry per round; the first variant of a round rotates."""
    names = list(variants)
    per_step: dict[str, list[float]] = {k: [] for k in names}
    for r in range(rounds):
        for k in names[r % len(names):] + names[: r % len(names)]:
            fn = variants[k]
            _sync(device)
            t0 = time.perf_counter()
            for _ in range(steps):
                fn()
            _sync(device)
            per_step[k].append((time.perf_counter() - t0) / steps)
    return per_step


def resnet_part(args: argparse.Namespace, ctx: Any) -> dict[str, Any]:
    import torch

    device = ctx.device
    ours, run = example_step(args, ctx)
    data_gib = sum(t.numel() * t.element_size() for t in run.loader.tensors) / 2**30
    # Steady-state peaks, each measured alone (the reference does not exist yet when the example's is
    # taken) and after the warm-up: cuDNN's autotuning tries workspaces once per shape, and the
    # second model would find the choices cached.
    _repeat(ours, args.warmup)()
    mem_ours = _peak_gib(device, _repeat(ours, 3))
    base = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    ref, ref_origin = reference_step(args, device)
    _repeat(ref, args.warmup)()
    mem_ref = _peak_gib(device, _repeat(ref, 3), base)
    times = interleave({"example": ours, "reference": ref}, args.rounds, args.steps, device)
    data_ms = _data_path_ms(run, args.steps, device)
    prof: dict[str, Any] | None = None
    if args.profile:
        prof, text = profile({"example": ours, "reference": ref}, max(3, args.steps // 4), device)
        Path(args.profile).write_text(text)
    ips = {k: [args.batch_size / s for s in v] for k, v in times.items()}
    ratios = [a / b for a, b in zip(ips["example"], ips["reference"])]
    return {
        "arch": args.arch, "image_size": args.image_size, "batch_size": args.batch_size,
        "precision": "bf16 autocast" if args.amp else "fp32", "channels_last": bool(args.channels_last),
        "example_model": run.model_origin, "reference_model": ref_origin,
        "img_per_s": {k: _stats(v) for k, v in ips.items()},
        "ratio": statistics.median(ips["example"]) / statistics.median(ips["reference"]),
        "ratio_per_round": _stats(ratios),
        "peak_memory_gib": {"example": mem_ours, "reference": mem_ref},
        "example_dataset_gib": data_gib, "rounds": args.rounds, "steps_per_round": args.steps,
        "example_data_path_ms": data_ms, "profile": prof,
    }


def _data_path_ms(run: Any, steps: int, device: Any) -> float:
    """ms per batch of the example's data path alone: the loader's index_select and the channels_last copy."""
    import torch

    fmt = torch.channels_last if run.args.channels_last else torch.contiguous_format
    it = iter(run.loader)
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        try:
            xb, _yb = next(it)
        except StopIteration:
            it = iter(run.loader)
            xb, _yb = next(it)
        xb.contiguous(memory_format=fmt)
    _sync(device)
    return (time.perf_counter() - t0) / steps * 1e3


def mnist_part(args: argparse.Namespace, ctx: Any) -> dict[str, Any]:
    import mnist_ddp

    common = ["--train-size", "10000", "--test-size", "200", "--cache", tempfile.gettempdir()]
    bs = int(mnist_ddp.parse_args(common).batch_size)
    runs = {
        "in-memory tensor": mnist_ddp.build(mnist_ddp.parse_args(common), ctx),
        "DataLoader": mnist_ddp.build(mnist_ddp.parse_args([*common, "--dataloader"]), ctx),
    }
    steps = min(args.mnist_steps, len(runs["DataLoader"].train))

    def epoch(run: Any) -> Callable[[], None]:
        def one() -> None:
            mnist_ddp.train_epoch(run, max_steps=steps)

        return one

    variants = {k: epoch(r) for k, r in runs.items()}
    for fn in variants.values():
        fn()  # warm-up epoch
    times = interleave(variants, args.rounds, 1, ctx.device)
    sps = {k: [steps * bs / s for s in v] for k, v in times.items()}
    return {
        "steps": steps, "batch_size": bs,
        "samples_per_s": {k: _stats(v) for k, v in sps.items()},
        "in_memory_over_dataloader": statistics.median(sps["in-memory tensor"]) / statistics.median(sps["DataLoader"]),
    }


def _num(x: float) -> str:
    """Three significant figures without exponent: 3719, 41.2, 0.284."""
    return f"{x:.0f}" if x >= 100 else f"{x:.3g}"


def _gib(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def markdown(res: dict[str, Any]) -> str:
    r = res["resnet"]
    lines = [
        f"{res['device_name']}, torch {res['torch']}, {res['date']}: {r['arch']} {r['image_size']} px, batch {r['batch_size']}, "
        f"{r['precision']}, channels_last={r['channels_last']}, {r['rounds']} rounds × {r['steps_per_round']} steps, interleaved",
        "",
        "| loop | model | img/s (median) | per-round range | peak memory (GiB) |",
        "|---|---|---|---|---|",
    ]
    for k, model in (("example", r["example_model"]), ("reference", r["reference_model"])):
        s = r["img_per_s"][k]
        mem = r["peak_memory_gib"][k]
        lines.append(f"| {'examples/resnet_ddp.py step' if k == 'example' else 'reference loop'} | {model} | "
                     f"{_num(s['median'])} | {_num(s['min'])}–{_num(s['max'])} | {_gib(mem)} |")
    q = r["ratio_per_round"]
    lines += ["", f"Example ÷ reference: **{r['ratio']:.3f}** (per round {q['min']:.3f}–{q['max']:.3f}); the example's "
              f"peak includes its synthetic dataset on the device ({r['example_dataset_gib']:.2f} GiB)."]
    if r.get("example_data_path_ms") is not None:
        lines.append(f"The example's data path alone (index_select + channels_last copy): {r['example_data_path_ms']:.2f} ms per batch.")
    if r.get("profile"):
        lines.append("Profile (ms per step, wall / kernels): " + "; ".join(
            f"{k} {v['wall_ms_per_step']:.2f} / {v['device_ms_per_step']:.2f}" for k, v in r["profile"].items()))
    if r["example_model"] != r["reference_model"]:
        lines.append(f"Note: the example used {r['example_model']}, the reference {r['reference_model']}.")
    if "mnist" in res:
        m = res["mnist"]
        lines += ["", "| MNIST path | samples/s (median) | per-round range |", "|---|---|---|"]
        for k, s in m["samples_per_s"].items():
            lines.append(f"| {k} | {_num(s['median'])} | {_num(s['min'])}–{_num(s['max'])} |")
        lines += ["", f"In-memory ÷ DataLoader throughput: **{m['in_memory_over_dataloader']:.2f}×** "
                  f"({m['steps']} steps of {m['batch_size']} per round)."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    import torchhpc.dist as thd

    if args.device == "auto" and not torch.cuda.is_available():
        print("No GPU visible: torch sees no CUDA device, nothing to measure. "
              "Run it on a GPU node (`--device cpu --quick --reference builtin` is a smoke run of the harness).")
        return 0
    args.amp = (args.device != "cpu") if args.amp is None else args.amp
    args.channels_last = (args.device != "cpu") if args.channels_last is None else args.channels_last
    args.num_classes = 1000 if args.image_size >= 64 else 10
    with thd.init(device="cpu" if args.device == "cpu" else None) as ctx:
        dev = ctx.device
        name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"
        res: dict[str, Any] = {"device_name": name, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
                               "host": socket.gethostname()}
        print(f"# gpu_training on {res['host']}: {name}, torch {torch.__version__}", flush=True)
        res["resnet"] = resnet_part(args, ctx)
        if args.mnist_steps > 0:
            res["mnist"] = mnist_part(args, ctx)
    text = markdown(res)
    print(text)
    print("RESULT " + json.dumps(res))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
