"""Pi by the trapezoid rule, the integral split across every rank, summed with all_reduce.

    pi = integral from 0 to 1 of 4 / (1 + x^2) dx

The seeds' "first distributed app": if it prints pi from every rank, the
launcher, the rendezvous and the network are right. It runs unchanged under

    torchhpc run -n 4 examples/pi.py
    torchrun --nproc_per_node 4 examples/pi.py
    srun -N2 --ntasks-per-node=2 python examples/pi.py        (srun-direct)
    mpirun -np 4 -x MASTER_ADDR -x MASTER_PORT python examples/pi.py

With torchhpc installed it lets ``torchhpc.dist.init()`` find the ranks; on a
node without torchhpc it reads them itself (torchrun's RANK/WORLD_SIZE, then
Slurm's SLURM_PROCID/SLURM_NTASKS, OpenMPI's OMPI_COMM_WORLD_*, MPICH's PMI_*),
so this file can be copied anywhere torch is.

Composite trapezoid error is h^2/12 * (f'(1) - f'(0)) = h^2/6 for this f, so
the default 10^8 steps is far below float64 rounding (~1e-15); anything above
~41,000 steps is below 1e-10. Evaluation is vectorised in float64 chunks, so
memory stays bounded whatever --steps is.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import socket
import sys
import time

CHUNK = 1 << 21  # points per vectorised chunk: 16 MiB of float64


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    # --n: the spelling some site scripts use for the same number.
    p.add_argument("--steps", "--n", type=int, default=100_000_000, help="trapezoid intervals in total (default 1e8)")
    p.add_argument(
        "--no-torchhpc",
        action="store_true",
        help="find the ranks without torchhpc, as on a node where it is not installed",
    )
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error(f"--steps={args.steps} must be at least 1")
    return args


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list: ``gpu[07-09,12],login1`` -> ``gpu07``."""
    m = re.match(r"^([^,\[]*)(?:\[([^\]]*)\])?", nodelist.strip())
    if not m:
        return nodelist
    head, ranges = m.group(1), m.group(2)
    if not ranges:
        return head
    first = ranges.split(",")[0].split("-")[0]
    return head + first


def ranks_from_env(env: dict[str, str]) -> tuple[int, int, str | None, str | None]:
    """(rank, world_size, master_addr, master_port) from whichever launcher started us.

    torchrun first: its variables are the most specific and it also runs inside
    Slurm jobs. MPI before Slurm: an mpirun inside an allocation still sees the
    batch step's SLURM_* variables, which do not describe its ranks.
    """
    addr, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
    if "RANK" in env and "WORLD_SIZE" in env:
        return int(env["RANK"]), int(env["WORLD_SIZE"]), addr, port
    if "OMPI_COMM_WORLD_RANK" in env:
        return int(env["OMPI_COMM_WORLD_RANK"]), int(env["OMPI_COMM_WORLD_SIZE"]), addr, port
    if "PMI_RANK" in env and "PMI_SIZE" in env:
        return int(env["PMI_RANK"]), int(env["PMI_SIZE"]), addr, port
    if "SLURM_PROCID" in env:
        ntasks = env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or "1"
        nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or ""
        if addr is None and nodes:
            addr = first_host(nodes)
        if port is None and env.get("SLURM_JOB_ID", "").isdigit():
            # Every rank computes the same port without talking; two jobs on a node differ.
            port = str(10000 + int(env["SLURM_JOB_ID"]) % 20000)
        return int(env["SLURM_PROCID"]), int(ntasks), addr, port
    return 0, 1, addr, port


def init(use_torchhpc: bool) -> tuple[int, int, str]:
    """Join the process group (gloo); returns (rank, world_size, how)."""
    import torch.distributed as dist

    if use_torchhpc:
        try:
            from torchhpc import dist as thdist
        except ImportError:
            thdist = None  # type: ignore[assignment]
        if thdist is not None and hasattr(thdist, "init"):
            try:
                ctx = thdist.init(backend="gloo")
            except TypeError:  # an init() without a backend argument
                ctx = thdist.init()
            rank = getattr(ctx, "rank", None)
            world = getattr(ctx, "world_size", None)
            if not dist.is_initialized():
                # torchhpc.dist leaves a one-process job without a group; we want the same code path.
                dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
            if rank is None or world is None:
                rank, world = dist.get_rank(), dist.get_world_size()
            return int(rank), int(world), "torchhpc.dist"

    rank, world, addr, port = ranks_from_env(dict(os.environ))
    if world == 1:
        # Plain `python pi.py`: a one-rank group needs no network at all.
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        return 0, 1, "single process"
    if addr is None or port is None:
        sys.exit(
            f"pi.py: rank {rank} of {world} but MASTER_ADDR={addr} MASTER_PORT={port}: "
            "export both (mpirun: -x MASTER_ADDR -x MASTER_PORT)"
        )
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        dist.init_process_group("gloo")  # env://: torchrun's contract is complete
    else:
        dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank, world_size=world)
    return rank, world, "env"


def partial_sum(first: int, last: int, steps: int) -> float:
    """Trapezoid area over intervals [first, last) of ``steps`` on [0, 1], float64.

    Sum f at the points first..last, then take half of each end point off: the
    interior points count fully, the two ends half, as the rule says.
    """
    import torch

    if last <= first:
        return 0.0
    h = 1.0 / steps
    total = 0.0
    for start in range(first, last + 1, CHUNK):
        stop = min(start + CHUNK, last + 1)
        x = torch.arange(start, stop, dtype=torch.float64).mul_(h)
        total += float(x.mul_(x).add_(1.0).reciprocal_().mul_(4.0).sum())

    def f(i: int) -> float:
        x = i * h
        return 4.0 / (1.0 + x * x)

    total -= 0.5 * (f(first) + f(last))
    return total * h


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch
    import torch.distributed as dist

    rank, world, how = init(use_torchhpc=not args.no_torchhpc)
    # This rank's share of the intervals: as even as integers allow.
    first = args.steps * rank // world
    last = args.steps * (rank + 1) // world

    dist.barrier()
    start = time.perf_counter()
    part = partial_sum(first, last, args.steps)
    total = torch.tensor([part], dtype=torch.float64)
    if dist.get_backend() == "nccl":  # a torchhpc.dist that chose nccl needs the tensor on the GPU
        total = total.cuda()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    elapsed = time.perf_counter() - start

    print(
        f"rank {rank}/{world} on {socket.gethostname()}: partial {part:.17g} "
        f"intervals [{first}, {last}) via {how}",
        flush=True,
    )
    if rank == 0:
        pi = float(total.item())
        print(
            f"pi ≈ {pi:.15f} error {abs(pi - math.pi):.1e} ranks {world} "
            f"steps {args.steps} time {elapsed:.2f} s",
            flush=True,
        )
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    if hasattr(sys.stdout, "reconfigure"):
        # "≈" must not kill rank 0 under a C locale (some batch systems run with no LANG).
        sys.stdout.reconfigure(errors="backslashreplace")
    raise SystemExit(main())
