"""ResNet-18/50 training in three modes, to reproduce seed 003's timing table.

    python examples/resnet_ddp.py --mode single                      # one device
    python examples/resnet_ddp.py --mode dp                          # DataParallel over all GPUs of the node
    torchhpc run -n 4 examples/resnet_ddp.py --mode ddp              # DDP, one rank per GPU
    torchhpc run -s slurm -N 2 -n 4 examples/resnet_ddp.py --mode ddp

Seed 003 trained ResNet-50 on MNIST and compared single GPU, DP and DDP on 1 and
2 nodes. DP is one process driving every GPU of a node (single node only); DDP
is one process per GPU. The models are plain torch.nn (examples/models.py):
torchvision does not import beside every torch build.

Data: ``synthetic`` (random images, for timing), ``digits`` (torchhpc's built-in
28×28 digits) or a directory of MNIST IDX files. On CUDA, channels_last and AMP
(bf16 where supported, else fp16 with a GradScaler) are on by default.

``--batch-size`` is per rank in ddp mode and per step in single/dp mode (DP
splits it across GPUs), so "same global batch" comparisons set it accordingly.
Prints per-epoch time and samples/s, then one ``RESULT {json}`` line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from models import ARCHS

import torchhpc.dist as thd
from torchhpc.dist import datasets
from torchhpc.errors import UsageError


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", choices=sorted(ARCHS), default="resnet18")
    p.add_argument("--mode", choices=("single", "dp", "ddp"), default="ddp")
    p.add_argument("--data", default="synthetic", help="'synthetic', 'digits' (built-in) or a directory of MNIST IDX files")
    p.add_argument("--samples", type=int, default=2048, help="synthetic/digits: training samples")
    p.add_argument("--image-size", type=int, default=32, help="synthetic: image side")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=64, help="per rank (ddp) or per step (single/dp)")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--amp", action=argparse.BooleanOptionalAction, default=None, help="mixed precision (default: on with CUDA)")
    p.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=None, help="NHWC (default: on with CUDA)")
    p.add_argument("--max-steps", type=int, default=None, help="stop each epoch after this many steps")
    p.add_argument("--warmup-steps", type=int, default=2, help="untimed steps before the first epoch")
    p.add_argument("--cache", default=None, help="built-in digits cache directory")
    return p.parse_args(argv)


def load_data(args: argparse.Namespace, ctx: Any) -> tuple[torch.Tensor, torch.Tensor, int, str]:
    """Images N×C×H×W (float, normalised) and labels; prepared once per job."""
    if args.data == "synthetic":
        g = torch.Generator().manual_seed(args.seed)
        x = torch.randn(args.samples, 3, args.image_size, args.image_size, generator=g)
        y = torch.randint(0, 10, (args.samples,), generator=g)
        return x, y, 3, "synthetic"
    with ctx.main_first():
        if args.data == "digits":
            d = datasets.builtin_digits(args.samples, 1000, cache_dir=args.cache)
        else:
            d = datasets.load_mnist(args.data)
    x, y, _, _ = d.normalized()
    return x, y, 1, d.source


def build_model(args: argparse.Namespace, ctx: Any, in_channels: int) -> tuple[torch.nn.Module, int]:
    """The model in the requested mode; returns it and the number of devices one step uses."""
    net = ARCHS[args.arch](num_classes=10, in_channels=in_channels, small_input=True)
    if args.channels_last:
        net = net.to(memory_format=torch.channels_last)
    if args.mode == "ddp":
        return ctx.wrap(net), 1
    if ctx.world_size > 1:
        raise UsageError(
            f"--mode {args.mode} runs in one process, but this job has {ctx.world_size} ranks",
            hint="launch single/dp with one process (`python examples/resnet_ddp.py --mode dp`), or use --mode ddp",
        )
    net = net.to(ctx.device)
    if args.mode == "dp" and ctx.device.type == "cuda" and torch.cuda.device_count() > 1:
        return torch.nn.DataParallel(net), torch.cuda.device_count()
    return net, 1


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    with thd.init() as ctx:  # leaving the block (also by an exception) destroys the process group
        result = _train(args, ctx)
        # Leave together: gloo ranks that tore down while a peer was still printing were
        # seen aborting at exit ("terminate called without an active exception").
        ctx.barrier()
    return result


def _train(args: argparse.Namespace, ctx: Any) -> dict[str, Any]:
    cuda = ctx.device.type == "cuda"
    args.amp = cuda if args.amp is None else args.amp
    args.channels_last = cuda if args.channels_last is None else args.channels_last
    ctx.seed(args.seed)
    x, y, channels, source = load_data(args, ctx)
    model, devices = build_model(args, ctx, channels)
    # DP keeps the batch on the first GPU and scatters it; DDP ranks each hold their shard.
    loader = ctx.tensor_loader(x, y, batch_size=args.batch_size, seed=args.seed, drop_last=True)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    amp_dtype = torch.bfloat16 if (not cuda or torch.cuda.is_bf16_supported()) else torch.float16
    scaler = torch.amp.GradScaler("cuda", enabled=args.amp and amp_dtype == torch.float16)
    ctx.print(
        f"{args.arch} mode={args.mode} world_size={ctx.world_size} devices/step={devices} device={ctx.device} "
        f"data={source} batch={args.batch_size} amp={args.amp and str(amp_dtype)} channels_last={args.channels_last}"
    )

    def step(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        if args.channels_last:
            xb = xb.contiguous(memory_format=torch.channels_last)
        opt.zero_grad(set_to_none=True)
        autocast = torch.autocast(ctx.device.type, dtype=amp_dtype) if args.amp else contextlib.nullcontext()
        with autocast:
            loss = F.cross_entropy(model(xb), yb)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss.detach()

    model.train()
    warm = iter(loader)
    for _ in range(args.warmup_steps):  # untimed: cuDNN autotuning, DDP's first-iteration bucket rebuild
        xb, yb = next(warm)
        step(xb, yb)
    loader.set_epoch(0)
    history = []
    total_start = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        ctx.barrier()
        start = time.perf_counter()
        loss_sum = torch.zeros((), device=ctx.device)
        seen = 0
        for i, (xb, yb) in enumerate(loader):
            if args.max_steps is not None and i >= args.max_steps:
                break
            loss_sum += step(xb, yb) * yb.shape[0]
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
        "mode": args.mode,
        "world_size": ctx.world_size,
        "devices_per_step": devices,
        "device": str(ctx.device),
        "amp": bool(args.amp),
        "channels_last": bool(args.channels_last),
        "total_time_s": time.perf_counter() - total_start,
        "epochs": history,
    }
    ctx.print("RESULT " + json.dumps(result))
    return result


if __name__ == "__main__":
    main()
