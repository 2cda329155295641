"""ResNet-18/50 training in three modes, to reproduce seed 003's timing table.

    python examples/resnet_ddp.py --mode single                      # one device
    python examples/resnet_ddp.py --mode dp                          # DataParallel over all GPUs of the node
    torchhpc run -n 4 examples/resnet_ddp.py --mode ddp              # DDP, one rank per GPU
    torchhpc run -s slurm -N 2 -n 4 examples/resnet_ddp.py --mode ddp

Seed 003 trained ResNet-50 on MNIST and compared single GPU, DP and DDP on 1 and
2 nodes. DP is one process driving every GPU of a node (single node only); DDP
is one process per GPU. The model is torchvision's when torchvision imports,
else the same layout in plain torch.nn (examples/models.py); the stem follows
the image size (ImageNet stem from 64 px, a small one below).

Defaults follow the device. On CUDA: ResNet-50 on ImageNet-size synthetic
images (224 px), batch 128 per rank, bf16 autocast (fp16 + GradScaler where bf16
is missing), channels_last, cuDNN autotuning. On CPU: ResNet-18 on 32 px
images, batch 64, fp32 — small enough for CI. Every default can be overridden.

Data: ``synthetic`` (random images, for timing; made on the device), ``digits``
(torchhpc's built-in 28×28 digits) or a directory of MNIST IDX files.

``--batch-size`` is per rank in ddp mode and per step in single/dp mode (DP
splits it across GPUs), so "same global batch" comparisons set it accordingly.
Prints per-epoch time and samples/s, then one ``RESULT {json}`` line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from models import ARCHS, SOURCES, build_resnet, describe_stem

import torchhpc.dist as thd
from torchhpc.dist import datasets
from torchhpc.errors import UsageError

# name: (on CUDA, on CPU)
DEVICE_DEFAULTS: dict[str, tuple[Any, Any]] = {
    "arch": ("resnet50", "resnet18"),
    "image_size": (224, 32),
    "batch_size": (128, 64),
    "samples": (4096, 2048),
}


def _int_at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an integer >= ``low``, else argparse's one-line usage error (not a tensor error later)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} must be at least {low}")
        return value

    return parse


positive_int = _int_at_least(1)
non_negative_int = _int_at_least(0)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", choices=sorted(ARCHS), default=None, help="default: resnet50 on CUDA, resnet18 on CPU")
    p.add_argument("--model-source", choices=SOURCES, default="auto", help="torchvision's ResNet (auto: if it imports) or the built-in one")
    p.add_argument("--mode", choices=("single", "dp", "ddp"), default="ddp")
    p.add_argument("--data", default="synthetic", help="'synthetic', 'digits' (built-in) or a directory of MNIST IDX files")
    p.add_argument("--samples", type=positive_int, default=None, help="synthetic/digits: training samples (default 4096 on CUDA, 2048 on CPU)")
    p.add_argument("--image-size", type=positive_int, default=None, help="synthetic: image side (default 224 on CUDA, 32 on CPU)")
    p.add_argument("--epochs", type=positive_int, default=1)
    p.add_argument("--batch-size", type=positive_int, default=None, help="per rank (ddp) or per step (single/dp); default 128 on CUDA, 64 on CPU")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--amp", action=argparse.BooleanOptionalAction, default=None, help="mixed precision (default: on with CUDA)")
    p.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=None, help="NHWC (default: on with CUDA)")
    p.add_argument("--max-steps", type=positive_int, default=None, help="stop each epoch after this many steps")
    p.add_argument("--warmup-steps", type=non_negative_int, default=2, help="untimed steps before the first epoch")
    p.add_argument("--num-classes", type=positive_int, default=None, help="synthetic: classes (default 1000 from 64 px, else 10)")
    p.add_argument("--cache", default=None, help="built-in digits cache directory")
    return p.parse_args(argv)


def resolve_defaults(args: argparse.Namespace, cuda: bool) -> argparse.Namespace:
    """Fill the device-dependent defaults (see the module docstring) into ``args``; returns it."""
    for name, (on_cuda, on_cpu) in DEVICE_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, on_cuda if cuda else on_cpu)
    args.amp = cuda if args.amp is None else args.amp
    args.channels_last = cuda if args.channels_last is None else args.channels_last
    if args.num_classes is None:
        # ImageNet-size synthetic data stands for ImageNet: 1000 classes, as torchvision's default head.
        args.num_classes = 1000 if args.data == "synthetic" and args.image_size >= 64 else 10
    return args


def load_data(args: argparse.Namespace, ctx: Any) -> tuple[torch.Tensor, torch.Tensor, int, str]:
    """Images N×C×H×W (float, normalised) and labels; prepared once per job."""
    if args.data == "synthetic":
        # Made where they are used: 4096 ImageNet-size images are 2.5 GB, slow to draw on a CPU.
        g = torch.Generator(device=ctx.device).manual_seed(args.seed)
        x = torch.randn(args.samples, 3, args.image_size, args.image_size, generator=g, device=ctx.device)
        y = torch.randint(0, args.num_classes, (args.samples,), generator=g, device=ctx.device)
        return x, y, 3, "synthetic"
    with ctx.main_first():
        if args.data == "digits":
            d = datasets.builtin_digits(args.samples, 1000, cache_dir=args.cache)
        else:
            d = datasets.load_mnist(args.data)
    x, y, _, _ = d.normalized()
    args.image_size = int(x.shape[-1])
    return x, y, 1, d.source


def build_model(args: argparse.Namespace, ctx: Any, in_channels: int) -> tuple[torch.nn.Module, int, str]:
    """The model in the requested mode; returns it, the number of devices one step uses, and its origin."""
    net, origin = build_resnet(
        args.arch, image_size=args.image_size, num_classes=args.num_classes, in_channels=in_channels,
        source=args.model_source,
    )
    if args.channels_last:
        net = net.to(memory_format=torch.channels_last)
    if args.mode == "ddp":
        return ctx.wrap(net), 1, origin
    if ctx.world_size > 1:
        raise UsageError(
            f"--mode {args.mode} runs in one process, but this job has {ctx.world_size} ranks",
            hint="launch single/dp with one process (`python examples/resnet_ddp.py --mode dp`), or use --mode ddp",
        )
    net = net.to(ctx.device)
    if args.mode == "dp" and ctx.device.type == "cuda" and torch.cuda.device_count() > 1:
        return torch.nn.DataParallel(net), torch.cuda.device_count(), origin
    return net, 1, origin


@dataclass
class Run:
    """One training run's parts, so benchmarks can time :attr:`step` against their own loop."""

    ctx: Any
    args: argparse.Namespace
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    loader: Any
    step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    devices: int
    source: str
    model_origin: str
    amp_dtype: torch.dtype


def build(args: argparse.Namespace, ctx: Any) -> Run:
    """Data, model, optimizer and the training step, with the defaults of ``ctx.device``."""
    cuda = ctx.device.type == "cuda"
    resolve_defaults(args, cuda)
    if cuda:
        torch.backends.cudnn.benchmark = True  # fixed shapes: let cuDNN pick its fastest kernels once
    ctx.seed(args.seed)
    x, y, channels, source = load_data(args, ctx)
    model, devices, origin = build_model(args, ctx, channels)
    # DP keeps the batch on the first GPU and scatters it; DDP ranks each hold their shard.
    loader = ctx.tensor_loader(x, y, batch_size=args.batch_size, seed=args.seed, drop_last=True)
    if len(loader) == 0:
        per_rank = x.shape[0] // ctx.world_size
        raise UsageError(
            f"--samples {x.shape[0]} gives {per_rank} sample(s) per rank, fewer than one batch of "
            f"--batch-size {args.batch_size} ({ctx.world_size} rank(s))",
            hint=f"use --samples {args.batch_size * ctx.world_size} or more, or a smaller --batch-size",
        )
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    amp_dtype = torch.bfloat16 if (not cuda or torch.cuda.is_bf16_supported()) else torch.float16
    scaler = torch.amp.GradScaler("cuda") if args.amp and amp_dtype == torch.float16 else None
    device_type = ctx.device.type

    def step(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        if args.channels_last:
            xb = xb.contiguous(memory_format=torch.channels_last)
        opt.zero_grad(set_to_none=True)
        autocast = torch.autocast(device_type, dtype=amp_dtype) if args.amp else contextlib.nullcontext()
        with autocast:
            loss = F.cross_entropy(model(xb), yb)
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        return loss.detach()

    return Run(ctx, args, model, opt, loader, step, devices, source, origin, amp_dtype)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    with thd.init() as ctx:  # leaving the block (also by an exception) destroys the process group
        result = train(build(args, ctx))
        # Leave together: gloo ranks that tore down while a peer was still printing were
        # seen aborting at exit ("terminate called without an active exception").
        ctx.barrier()
    return result


def train(run: Run) -> dict[str, Any]:
    ctx, args = run.ctx, run.args
    cuda = ctx.device.type == "cuda"
    ctx.print(
        f"{args.arch} ({run.model_origin}, stem {describe_stem(args.image_size)}) mode={args.mode} "
        f"world_size={ctx.world_size} devices/step={run.devices} device={ctx.device} data={run.source} "
        f"{args.image_size}px batch={args.batch_size} amp={args.amp and str(run.amp_dtype)} channels_last={args.channels_last}"
    )
    run.model.train()
    warm = iter(run.loader)
    for _ in range(args.warmup_steps):  # untimed: cuDNN autotuning, DDP's first-iteration bucket rebuild
        try:
            xb, yb = next(warm)
        except StopIteration:
            warm = iter(run.loader)
            xb, yb = next(warm)
        run.step(xb, yb)
    run.loader.set_epoch(0)
    history = []
    total_start = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        ctx.barrier()
        start = time.perf_counter()
        loss_sum = torch.zeros((), device=ctx.device)
        seen = 0
        for i, (xb, yb) in enumerate(run.loader):
            if args.max_steps is not None and i >= args.max_steps:
                break
            loss_sum += run.step(xb, yb) * yb.shape[0]
            seen += yb.shape[0]
        if cuda:
            torch.cuda.synchronize()
        seconds = float(thd.all_reduce_max(torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=ctx.device)))
        loss = ctx.average_metrics({"loss": float(loss_sum) / max(seen, 1)}, weight=seen)["loss"]
        rec = {"epoch": epoch, "loss": loss, "epoch_time_s": seconds, "samples_per_s": seen * ctx.world_size / seconds}
        history.append(rec)
        ctx.print(f"epoch {epoch}: loss {loss:.4f}  {rec['samples_per_s']:.1f} samples/s  epoch time {seconds:.2f}s")
    result = {
        "arch": args.arch,
        "model": run.model_origin,
        "image_size": args.image_size,
        "batch_size": args.batch_size,
        "mode": args.mode,
        "world_size": ctx.world_size,
        "devices_per_step": run.devices,
        "device": str(ctx.device),
        "amp": bool(args.amp),
        "channels_last": bool(args.channels_last),
        "total_time_s": time.perf_counter() - total_start,
        "epochs": history,
    }
    if cuda:
        result["max_memory_allocated_gib"] = torch.cuda.max_memory_allocated(ctx.device) / 2**30
    ctx.print("RESULT " + json.dumps(result))
    return result


if __name__ == "__main__":
    main()
