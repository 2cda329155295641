"""Sharded data for DDP, with ``set_epoch`` handled so nobody can forget it.

The classic bug: a ``DistributedSampler`` whose ``set_epoch`` is never called
shuffles every epoch the same way, silently. Both loaders here count their own
epochs: each ``for batch in loader`` is the next epoch and reshuffles with
``seed + epoch``; ``loader.set_epoch(n)`` is only needed when resuming.

:func:`loader` wraps any ``Dataset`` (the classic path: ``DataLoader`` +
``DistributedSampler``). :class:`TensorLoader` is the fast path for data that
fits in memory: the whole dataset is one tensor (on CPU or GPU), each epoch is
one permutation shared by all ranks, and a batch is an ``index_select`` — no
per-sample Python, no collate. Seed 003-style MNIST runs measured a 1.42× step
cost for per-sample transforms over this.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from torchhpc.dist.sync import rank as _rank
from torchhpc.dist.sync import world_size as _world_size
from torchhpc.errors import UsageError

if TYPE_CHECKING:
    import torch
    from torch.utils.data import DataLoader, Dataset

__all__ = ["EpochLoader", "TensorLoader", "loader", "shard_indices"]


def shard_indices(n: int, epoch: int, *, rank: int, world_size: int, shuffle: bool, seed: int, drop_last: bool) -> torch.Tensor:
    """This rank's indices for one epoch, with DistributedSampler's semantics.

    The permutation depends only on ``(seed, epoch)`` so every rank draws the same
    one and takes the strided slice ``rank::world_size``; without ``drop_last``
    the tail is padded by wrapping so every rank runs the same number of steps
    (a rank with one step fewer would hang the others in all-reduce).
    """
    import torch

    if shuffle:
        g = torch.Generator().manual_seed(seed + epoch)
        order = torch.randperm(n, generator=g)
    else:
        order = torch.arange(n)
    if drop_last:
        per = n // world_size
        order = order[: per * world_size]
    else:
        per = math.ceil(n / world_size)
        pad = per * world_size - n
        if pad:
            order = torch.cat([order, order.repeat(math.ceil(pad / max(n, 1)))[:pad]])
    return order[rank : per * world_size : world_size]


class TensorLoader:
    """Batches sliced from whole-dataset tensors; every iteration is a new epoch.

    ``tensors`` share their first dimension (e.g. images N×C×H×W and labels N).
    Move them to the GPU once (``device=``) and batches never cross PCIe again.
    """

    def __init__(
        self,
        *tensors: torch.Tensor,
        batch_size: int,
        shuffle: bool = True,
        drop_last: bool = False,
        seed: int = 0,
        device: Any = None,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        if not tensors:
            raise UsageError("TensorLoader needs at least one tensor", hint="TensorLoader(images, labels, batch_size=64)")
        n = tensors[0].shape[0]
        for i, t in enumerate(tensors):
            if t.shape[0] != n:
                raise UsageError(
                    f"TensorLoader: tensor {i} has {t.shape[0]} rows but tensor 0 has {n}",
                    hint="pass tensors that describe the same samples (images and their labels)",
                )
        if batch_size < 1:
            raise UsageError(f"batch_size={batch_size} must be >= 1", hint="pass the per-rank batch size")
        self.tensors = tuple(t.to(device) if device is not None else t for t in tensors)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.seed = seed
        self.rank = _rank() if rank is None else rank
        self.world_size = _world_size() if world_size is None else world_size
        self.epoch = 0
        self._n = n

    def set_epoch(self, epoch: int) -> None:
        """Start the next iteration at ``epoch`` (resuming from a checkpoint)."""
        self.epoch = epoch

    def indices(self, epoch: int | None = None) -> torch.Tensor:
        """This rank's sample indices for ``epoch`` (default: the next one)."""
        return shard_indices(
            self._n,
            self.epoch if epoch is None else epoch,
            rank=self.rank,
            world_size=self.world_size,
            shuffle=self.shuffle,
            seed=self.seed,
            drop_last=self.drop_last,
        )

    def __len__(self) -> int:
        per = self._n // self.world_size if self.drop_last else math.ceil(self._n / self.world_size)
        return per // self.batch_size if self.drop_last else math.ceil(per / self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        idx = self.indices()
        self.epoch += 1
        device = self.tensors[0].device
        if device.type == "cuda":
            # From pageable memory a copy to the GPU first waits for the stream to drain (an idle GPU at
            # every epoch start); from pinned memory it is queued behind the previous steps.
            idx = idx.pin_memory().to(device, non_blocking=True)
        else:
            idx = idx.to(device)
        stop = (len(idx) // self.batch_size) * self.batch_size if self.drop_last else len(idx)
        for start in range(0, stop, self.batch_size):
            sel = idx[start : start + self.batch_size]
            yield tuple(t.index_select(0, sel) for t in self.tensors)


class EpochLoader:
    """A ``DataLoader`` whose ``DistributedSampler`` is advanced on every ``iter()``."""

    def __init__(self, dataloader: DataLoader[Any], sampler: Any) -> None:
        self.dataloader = dataloader
        self.sampler = sampler
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Start the next iteration at ``epoch`` (resuming from a checkpoint)."""
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.dataloader)

    def __iter__(self) -> Iterator[Any]:
        if self.sampler is not None and hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(self.epoch)
        self.epoch += 1
        return iter(self.dataloader)

    def __getattr__(self, name: str) -> Any:
        # Behave like the DataLoader for everything else (dataset, batch_size, ...).
        return getattr(self.dataloader, name)


def loader(
    dataset: Dataset[Any] | Sequence[Any],
    batch_size: int,
    *,
    shuffle: bool = True,
    drop_last: bool = False,
    seed: int = 0,
    num_workers: int = 0,
    pin_memory: bool | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    **dataloader_kwargs: Any,
) -> EpochLoader:
    """A per-rank ``DataLoader`` over a ``DistributedSampler`` (or a plain one in a single process).

    ``batch_size`` is per rank, as in DDP. ``pin_memory`` defaults to on when CUDA is
    available. Extra keyword arguments go to ``DataLoader`` (``collate_fn``,
    ``persistent_workers``, ...); ``sampler``/``shuffle`` conflicts are refused.
    """
    import torch
    from torch.utils.data import DataLoader, DistributedSampler

    if "sampler" in dataloader_kwargs or "batch_sampler" in dataloader_kwargs:
        raise UsageError(
            "loader() builds its own DistributedSampler; got sampler=/batch_sampler=",
            hint="use torch.utils.data.DataLoader directly for a custom sampler, and call sampler.set_epoch yourself",
        )
    ws = _world_size() if world_size is None else world_size
    rk = _rank() if rank is None else rank
    sampler: Any = None
    if ws > 1:
        sampler = DistributedSampler(
            dataset,  # type: ignore[arg-type]
            num_replicas=ws,
            rank=rk,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
        )
    elif shuffle:
        # Single process: still reproducible and still reshuffled per epoch.
        sampler = _SeededRandomSampler(len(dataset), seed)  # type: ignore[arg-type]
    if pin_memory is None:
        pin_memory = torch.cuda.is_available()
    dl = DataLoader(
        dataset,  # type: ignore[arg-type]
        batch_size=batch_size,
        sampler=sampler,
        drop_last=drop_last,
        num_workers=num_workers,
        pin_memory=pin_memory,
        **dataloader_kwargs,
    )
    return EpochLoader(dl, sampler)


class _SeededRandomSampler:
    """Single-process sampler with the same ``set_epoch`` contract as DistributedSampler."""

    def __init__(self, n: int, seed: int) -> None:
        self.n = n
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        import torch

        g = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(torch.randperm(self.n, generator=g).tolist())
