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

import functools
import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from torchhpc.dist.sync import rank as _rank
from torchhpc.dist.sync import world_size as _world_size
from torchhpc.errors import UsageError

if TYPE_CHECKING:
    import torch
    from torch.utils.data import DataLoader, Dataset

__all__ = ["EpochLoader", "TensorLoader", "loader", "shard_indices", "strided_sampler"]


def shard_indices(n: int, epoch: int, *, rank: int, world_size: int, shuffle: bool, seed: int, drop_last: bool,
                  start: int = 0) -> torch.Tensor:
    """This rank's indices for one epoch, with DistributedSampler's semantics.

    The permutation depends only on ``(seed, epoch)`` so every rank draws the same
    one and takes the strided slice ``rank::world_size``; without ``drop_last``
    the tail is padded by wrapping so every rank runs the same number of steps
    (a rank with one step fewer would hang the others in all-reduce). ``start``:
    the samples of the permutation the job already consumed (a resume, perhaps on
    another world size: :mod:`torchhpc.dist.position`); the rest is dealt the same way.
    """
    import torch

    if shuffle:
        g = torch.Generator().manual_seed(seed + epoch)
        order = torch.randperm(n, generator=g)
    else:
        order = torch.arange(n)
    order = order[start:]
    n = len(order)
    if drop_last:
        per = n // world_size
        order = order[: per * world_size]
    else:
        per = math.ceil(n / world_size)
        pad = per * world_size - n
        if pad:
            order = torch.cat([order, order.repeat(math.ceil(pad / max(n, 1)))[:pad]])
    return order[rank : per * world_size : world_size]


class _Positioned:
    """What both loaders share: the next epoch, and the job's place in the data (``self._pos``)."""

    epoch: int
    _pos: _Dealt

    def set_epoch(self, epoch: int) -> None:
        """Start the next iteration at ``epoch`` (resuming from a checkpoint)."""
        self.epoch = epoch

    def state_dict(self) -> dict[str, int]:
        """The job's place in the data (the epoch, the samples of it consumed by all ranks): the same on every
        rank, and meaningful on any world size (:mod:`torchhpc.dist.position`)."""
        return self._pos.state_dict(self.epoch)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go on from ``state`` (this loader's or one saved on another world size): the rest of its epoch is
        dealt to this world's ranks."""
        self.epoch = self._pos.load(state)


class TensorLoader(_Positioned):
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
        ledger: str | None = None,
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
        self._pos = _Dealt(n, batch_size, self.world_size, ledger, self.rank)

    def indices(self, epoch: int | None = None) -> torch.Tensor:
        """This rank's sample indices for ``epoch`` (default: the next one, from where a resume left it)."""
        return shard_indices(
            self._n,
            self.epoch if epoch is None else epoch,
            rank=self.rank,
            world_size=self.world_size,
            shuffle=self.shuffle,
            seed=self.seed,
            drop_last=self.drop_last,
            start=self._pos.start if epoch is None or epoch == self.epoch else 0,
        )

    def __len__(self) -> int:
        left = self._n - self._pos.start
        per = left // self.world_size if self.drop_last else math.ceil(left / self.world_size)
        return per // self.batch_size if self.drop_last else math.ceil(per / self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        idx = self.indices()
        deal = self._pos.begin(self.epoch, idx.tolist())
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
            deal.handed(start)
            yield tuple(t.index_select(0, sel) for t in self.tensors)
        deal.done()


class EpochLoader(_Positioned):
    """A ``DataLoader`` whose sampler is advanced on every ``iter()``, and whose place in the data is the job's
    (``state_dict``/``load_state_dict``, as :class:`TensorLoader`'s)."""

    def __init__(self, dataloader: DataLoader[Any], sampler: Any, ledger: str | None = None) -> None:
        self.dataloader = dataloader
        self.sampler = sampler
        self.epoch = 0
        strided = isinstance(sampler, _strided_class())
        rank, world = (sampler.rank, sampler.num_replicas) if strided else (0, 1)
        self._pos = _Dealt(len(dataloader.dataset), dataloader.batch_size or 1, world, ledger, rank)  # type: ignore[arg-type]
        self._strided = strided

    def __len__(self) -> int:
        return len(self.dataloader)

    def __iter__(self) -> Iterator[Any]:
        if self.sampler is not None and hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(self.epoch)
        if self._strided:
            self.sampler.start = self._pos.start
        mine = list(self.sampler) if self._strided else []
        deal = self._pos.begin(self.epoch, mine)
        self.epoch += 1
        return _counted(iter(self.dataloader), deal, self.dataloader.batch_size or 1)

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
    ledger: str | None = None,
    **dataloader_kwargs: Any,
) -> EpochLoader:
    """A per-rank ``DataLoader`` over a ``DistributedSampler`` (or a plain one in a single process).

    ``batch_size`` is per rank, as in DDP. ``pin_memory`` defaults to on when CUDA is
    available. Extra keyword arguments go to ``DataLoader`` (``collate_fn``,
    ``persistent_workers``, ...); ``sampler``/``shuffle`` conflicts are refused.
    """
    import torch
    from torch.utils.data import DataLoader

    if "sampler" in dataloader_kwargs or "batch_sampler" in dataloader_kwargs:
        raise UsageError(
            "loader() builds its own DistributedSampler; got sampler=/batch_sampler=",
            hint="use torch.utils.data.DataLoader directly for a custom sampler, and call sampler.set_epoch yourself",
        )
    ws = _world_size() if world_size is None else world_size
    rk = _rank() if rank is None else rank
    # DistributedSampler's layout (a permutation of seed + epoch, dealt by stride), with a start: a resume on
    # another world size goes on from the job's place (torchhpc.dist.position). One process: the same, W = 1.
    sampler: Any = strided_sampler(len(dataset), rank=rk, world_size=ws, shuffle=shuffle, seed=seed,  # type: ignore[arg-type]
                                   drop_last=drop_last)
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
    return EpochLoader(dl, sampler, ledger=ledger)


def strided_sampler(n: int, *, rank: int, world_size: int, shuffle: bool, seed: int, drop_last: bool) -> Any:
    """A ``DistributedSampler`` (code that checks for one still finds one) over ``n`` samples whose epoch starts
    ``sampler.start`` samples in: the rest of an epoch a resume deals to this world's ranks (:func:`shard_indices`)."""
    return _strided_class()(range(n), num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed,
                            drop_last=drop_last)


@functools.lru_cache(maxsize=1)
def _strided_class() -> type:
    from torch.utils.data import DistributedSampler

    class StridedSampler(DistributedSampler):  # type: ignore[type-arg]
        start = 0

        def __len__(self) -> int:
            left = len(self.dataset) - self.start  # type: ignore[arg-type]
            return left // self.num_replicas if self.drop_last else math.ceil(left / self.num_replicas)

        def __iter__(self) -> Iterator[int]:
            return iter(shard_indices(len(self.dataset), self.epoch, rank=self.rank,  # type: ignore[arg-type]
                                      world_size=self.num_replicas, shuffle=self.shuffle, seed=self.seed,
                                      drop_last=self.drop_last, start=self.start).tolist())

    return StridedSampler


class _Dealt:
    """The position of one loader (torchhpc.dist.position): where this iteration started, how many batches
    this rank was handed, and the ledger line of each."""

    def __init__(self, n: int, batch_size: int, world_size: int, ledger: str | None, rank: int) -> None:
        from torchhpc.dist.position import Ledger, Position

        self.n, self.batch, self.world = n, batch_size, world_size
        self.pos, self.ledger = Position(), Ledger(ledger, rank, world_size)
        self.start = 0  # samples of the next epoch already consumed (a resume)
        self.mine: list[int] = []
        self.running = False

    def state_dict(self, next_epoch: int) -> dict[str, int]:
        if self.running and self.pos.consumed >= self.n:  # the last batch handed out: the next epoch is next
            return {"epoch": self.pos.epoch + 1, "consumed": 0}
        if self.running:
            return self.pos.state_dict()
        return {"epoch": next_epoch, "consumed": self.start}

    def load(self, state: dict[str, Any]) -> int:
        self.pos.load(state)
        self.start, self.running = min(self.pos.consumed, self.n), False
        self.ledger.resumed(self.pos.epoch, self.start)
        return self.pos.epoch

    def begin(self, epoch: int, mine: list[int]) -> _Dealt:
        self.pos.epoch, self.pos.consumed, self.mine, self.running = epoch, self.start, mine, True
        self.start = 0
        return self

    def handed(self, offset: int) -> None:
        """This rank was handed its batch at ``offset`` of its indices: every rank, its own (lockstep)."""
        self.pos.consumed = min(self.n, self.pos.consumed + self.batch * self.world)
        self.ledger.batch(self.pos.epoch, self.mine[offset : offset + self.batch], self.pos.consumed)

    def done(self) -> None:
        self.running = False  # the next position is the next epoch's start


def _counted(batches: Iterator[Any], deal: _Dealt, batch_size: int) -> Iterator[Any]:
    for i, batch in enumerate(batches):
        deal.handed(i * batch_size)
        yield batch
    deal.done()
