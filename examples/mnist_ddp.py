"""MNIST with DistributedDataParallel, runnable anywhere torchhpc can launch it.

    python examples/mnist_ddp.py --epochs 1                 # one process, no launcher
    torchhpc run -n 2 examples/mnist_ddp.py --epochs 3      # 2 ranks on this machine
    torchhpc run -s slurm -N 2 -n 2 examples/mnist_ddp.py   # 2 nodes, torchrun per node

Data: real MNIST from ``--data DIR`` (IDX files, ``.gz`` or not, also under
``MNIST/raw``), otherwise torchhpc's built-in deterministic 28×28 digits, so it
runs offline. Either way the data is prepared once per job (``main_first``) —
seed 002's demo downloaded once per rank and got throttled.

The default data path holds the whole dataset as one tensor on the training
device and slices batches by index; ``--dataloader`` uses the classic
``DataLoader`` + ``DistributedSampler`` path instead.

Prints per epoch: loss, test accuracy, samples/s, epoch time; and at the end one
``RESULT {json}`` line for scripts (benchmarks, tests) to parse.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from models import MnistCNN

import torchhpc.dist as thd
from torchhpc.dist import datasets


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64, help="per rank (DDP semantics; global = this × world size)")
    p.add_argument("--test-batch-size", type=int, default=1000)
    p.add_argument("--lr", type=float, default=1.0, help="Adadelta learning rate (PyTorch examples' default)")
    p.add_argument("--gamma", type=float, default=0.7, help="learning-rate decay per epoch")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--data", default=None, metavar="DIR", help="directory with MNIST IDX files (default: built-in digits)")
    p.add_argument("--train-size", type=int, default=10000, help="built-in digits: training samples")
    p.add_argument("--test-size", type=int, default=2000, help="built-in digits: test samples")
    p.add_argument("--cache", default=None, metavar="DIR", help="where the built-in digits are cached (default $TORCHHPC_CACHE or ~/.cache/torchhpc)")
    p.add_argument("--local-prepare", action="store_true", help="prepare data once per node (node-local disks) instead of once per job")
    p.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=True, help="NHWC memory format (faster convolutions on CPU and GPU)")
    p.add_argument("--dataloader", action="store_true", help="classic DataLoader + DistributedSampler path")
    p.add_argument("--num-workers", type=int, default=0, help="DataLoader workers (with --dataloader)")
    p.add_argument("--bucket-cap-mb", type=float, default=None, help="DDP bucket size")
    p.add_argument("--static-graph", action="store_true", help="DDP static_graph=True")
    p.add_argument("--max-steps", type=int, default=None, help="stop each epoch after this many steps (smoke tests)")
    p.add_argument("--save", default=None, metavar="PATH", help="save the trained weights (rank 0)")
    return p.parse_args(argv)


@dataclass
class Run:
    """Everything one training run holds, so benchmarks can drive epochs themselves."""

    ctx: Any
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    train: Any
    test_x: torch.Tensor
    test_y: torch.Tensor
    source: str
    channels_last: bool = False


def build(args: argparse.Namespace, ctx: Any) -> Run:
    """Data (prepared once), model (wrapped), optimizer — the setup of the classic example."""
    ctx.seed(args.seed)
    with ctx.main_first(local=args.local_prepare):  # one download/render per job (per node with --local-prepare)
        data = datasets.load_mnist(args.data) if args.data else datasets.builtin_digits(args.train_size, args.test_size, cache_dir=args.cache)
    device = ctx.device
    if args.dataloader:
        # Classic path: per-sample indexing + collate, on CPU, moved per batch.
        tx, ty, test_x, test_y = data.normalized()
        train: Any = ctx.loader(
            torch.utils.data.TensorDataset(tx, ty), args.batch_size, seed=args.seed, num_workers=args.num_workers
        )
        test_x, test_y = test_x.to(device), test_y.to(device)
    else:
        tx, ty, test_x, test_y = data.normalized(device)
        train = ctx.tensor_loader(tx, ty, batch_size=args.batch_size, seed=args.seed)
    net = MnistCNN()
    if args.channels_last:
        net = net.to(memory_format=torch.channels_last)
    model = ctx.wrap(net, bucket_cap_mb=args.bucket_cap_mb, static_graph=args.static_graph)
    optimizer = torch.optim.Adadelta(model.parameters(), lr=args.lr)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=args.gamma)
    return Run(ctx, model, optimizer, scheduler, train, test_x, test_y, data.source, args.channels_last)


def train_epoch(run: Run, max_steps: int | None = None) -> dict[str, float]:
    """One pass over this rank's shard; returns the mean loss, samples and seconds (this rank)."""
    model, opt, device = run.model, run.optimizer, run.ctx.device
    model.train()
    loss_sum = torch.zeros((), device=device)
    seen = 0
    start = time.perf_counter()
    for step, (x, y) in enumerate(run.train):
        if max_steps is not None and step >= max_steps:
            break
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        if run.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        # No .item() here: a host sync per step would stall the GPU pipeline.
        loss_sum += loss.detach() * y.shape[0]
        seen += y.shape[0]
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    run.scheduler.step()
    return {"loss": float(loss_sum) / max(seen, 1), "samples": float(seen), "seconds": seconds}


@torch.no_grad()
def evaluate(run: Run, batch_size: int = 1000) -> dict[str, float]:
    """Exact test accuracy: each rank scores a disjoint strided slice, counts are summed."""
    model = run.model
    model.eval()
    rank, world = run.ctx.rank, run.ctx.world_size
    x_all, y_all = run.test_x[rank::world], run.test_y[rank::world]
    counts = torch.zeros(3, dtype=torch.float64, device=run.ctx.device)  # correct, total, loss sum
    for i in range(0, x_all.shape[0], batch_size):
        x, y = x_all[i : i + batch_size], y_all[i : i + batch_size]
        out = model(x)
        counts[0] += (out.argmax(1) == y).sum()
        counts[1] += y.shape[0]
        counts[2] += F.cross_entropy(out, y, reduction="sum")
    counts = thd.all_reduce_sum(counts).cpu()
    return {"accuracy": float(counts[0] / counts[1]), "test_loss": float(counts[2] / counts[1])}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    with thd.init() as ctx:  # leaving the block (also by an exception) destroys the process group
        result = _train(args, ctx)
        # Leave together: gloo ranks that tore down while a peer was still printing were
        # seen aborting at exit ("terminate called without an active exception").
        ctx.barrier()
    return result


def _train(args: argparse.Namespace, ctx: Any) -> dict[str, Any]:
    run = build(args, ctx)
    world = ctx.world_size
    ctx.print(
        f"MNIST DDP: world_size={world} device={ctx.device} backend={ctx.backend} data={run.source} "
        f"path={'dataloader' if args.dataloader else 'in-memory tensor'} batch={args.batch_size}/rank"
    )
    history = []
    for epoch in range(1, args.epochs + 1):
        stats = train_epoch(run, args.max_steps)
        # Throughput counts every rank's samples over the slowest rank's time.
        agg = ctx.average_metrics({"loss": stats["loss"]}, weight=stats["samples"])
        slowest = float(thd.all_reduce_max(torch.tensor([stats["seconds"]], dtype=torch.float64, device=ctx.device)))
        total = stats["samples"] * world
        ev = evaluate(run, args.test_batch_size)
        rec = {
            "epoch": epoch,
            "loss": agg["loss"],
            "accuracy": ev["accuracy"],
            "test_loss": ev["test_loss"],
            "epoch_time_s": slowest,
            "samples_per_s": total / slowest if slowest > 0 else 0.0,
        }
        history.append(rec)
        ctx.print(
            f"epoch {epoch}: loss {rec['loss']:.4f}  test accuracy {100 * rec['accuracy']:.2f}%  "
            f"{rec['samples_per_s']:.0f} samples/s  epoch time {slowest:.2f}s"
        )
    result = {"world_size": world, "device": str(ctx.device), "source": run.source, "epochs": history}
    if args.save and ctx.is_main:
        torch.save(thd.unwrap(run.model).state_dict(), args.save)
    ctx.print("RESULT " + json.dumps(result))
    return result


if __name__ == "__main__":
    main()
