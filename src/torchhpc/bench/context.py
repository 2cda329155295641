"""Join (or reuse) the job's process group for the benchmark.

``torchhpc.dist.init()`` knows every launcher (torchrun, Slurm, MPI, PBS,
Kubeflow). A lone process gets a one-rank group, so
the benchmark also runs from a bare ``python -m torchhpc.bench`` on a laptop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchhpc.errors import UsageError

if TYPE_CHECKING:
    from torchhpc.dist import DistContext

__all__ = ["cleanup", "init"]


def _want_cuda(device: str) -> bool:
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda was asked for but torch sees no GPU",
                         "drop --device (auto picks the CPU and gloo) or run on a GPU node")
    return device == "cuda" or (device == "auto" and torch.cuda.is_available())


def init(device: str = "auto") -> DistContext:
    """A process group on the right device: NCCL on CUDA, gloo on CPU (``$TORCHHPC_BACKEND`` overrides).

    ``torchhpc.dist.init`` detects the launcher (torchrun, srun, mpirun, PBS,
    Kubeflow, none) and adopts a group the caller already started; a lone
    process still gets a one-rank group so every collective can run.
    """
    import torchhpc.dist as tdist

    cuda = _want_cuda(device)
    return tdist.init(device=None if cuda else "cpu", single_group=True)


def cleanup(ctx: DistContext) -> None:
    """Destroy the group if :func:`init` started it (``torchhpc.dist.cleanup`` knows)."""
    import torchhpc.dist as tdist

    tdist.cleanup()
