"""Join (or reuse) the job's process group for the benchmark.

``torchhpc.dist.init()`` knows every launcher (torchrun, Slurm, MPI, PBS,
Kubeflow). A lone process gets a one-rank group, so
the benchmark also runs from a bare ``python -m torchhpc.bench`` on a laptop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torchhpc.errors import UsageError

__all__ = ["BenchContext", "cleanup", "init"]


@dataclass
class BenchContext:
    rank: int
    world_size: int
    local_rank: int
    device: Any  # torch.device
    backend: str
    owned: bool  # we created the process group, so we destroy it

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _want_cuda(device: str) -> bool:
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda was asked for but torch sees no GPU",
                         "drop --device (auto picks the CPU and gloo) or run on a GPU node")
    return device == "cuda" or (device == "auto" and torch.cuda.is_available())


def init(device: str = "auto") -> BenchContext:
    """A process group on the right device: NCCL on CUDA, gloo on CPU (``$TORCHHPC_BACKEND`` overrides).

    ``torchhpc.dist.init`` detects the launcher (torchrun, srun, mpirun, PBS,
    Kubeflow, none) and adopts a group the caller already started; a lone
    process still gets a one-rank group so every collective can run.
    """
    import torchhpc.dist as tdist

    cuda = _want_cuda(device)
    ctx = tdist.init(device=None if cuda else "cpu", single_group=True)
    return BenchContext(ctx.rank, ctx.world_size, ctx.local_rank, ctx.device, ctx.backend, ctx.owns_group)


def cleanup(ctx: BenchContext) -> None:
    """Destroy the group if :func:`init` started it (``torchhpc.dist.cleanup`` knows)."""
    import torchhpc.dist as tdist

    tdist.cleanup()
