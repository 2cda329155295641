"""``init()`` / ``cleanup()`` and the small context a training script keeps.

One call replaces the usual twenty lines of "read RANK, or SLURM_PROCID, or
OMPI_COMM_WORLD_RANK, pick the GPU, pick the backend, find the master": it
detects the launcher (:mod:`torchhpc.env`), picks the device (this rank's
CUDA device by local rank, else CPU) and the backend (nccl on CUDA, gloo
otherwise), and starts the default process group with a timeout.

Single process (no launcher, world size 1): no process group is started by
default. Every helper in :mod:`torchhpc.dist` degrades to a no-op without one
(``wrap`` returns the model unwrapped, ``barrier`` returns), so ``python
train.py`` runs unchanged and pays no DDP overhead. ``single_group=True``
starts a one-rank group on an in-memory store (no port) for code that calls
``torch.distributed`` directly.

How ``init`` picks the device and backend and starts the group is :mod:`torchhpc.dist.group`'s.

torch is imported inside functions only: ``import torchhpc.dist`` stays cheap.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from torchhpc.dist.group import pick_backend, pick_device, preflight, start_group
from torchhpc.dist.teardown import gloo_workers_settle, run_before_teardown, settle_at_exit
from torchhpc.env import DistEnv, detect, export
from torchhpc.errors import EnvironmentDetectionError, TorchHPCError

if TYPE_CHECKING:
    import torch

__all__ = ["DEFAULT_TIMEOUT", "DistContext", "checkpoint_group", "cleanup", "current", "init", "log0", "print0"]

DEFAULT_TIMEOUT = timedelta(minutes=10)
_LOG = logging.getLogger("torchhpc.dist")
_CONTEXT: DistContext | None = None
_CHECKPOINT_GROUP: Any = None


@dataclass
class DistContext:
    """Where this process trains: rank, world, device, backend.

    Kept deliberately plain so other modules can add behaviour as methods that
    delegate to functions (see :meth:`wrap`, :meth:`loader`, :meth:`main_first`).
    """

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    device: torch.device
    backend: str  # the group's backend, or the one init() would use (single process, no group)
    env: DistEnv
    owns_group: bool = False
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that prints, logs, downloads and saves checkpoints."""
        return self.rank == 0

    @property
    def is_local_main(self) -> bool:
        return self.local_rank == 0

    @property
    def distributed(self) -> bool:
        """True when a process group is up (also when the user started it)."""
        from torchhpc.dist.sync import is_distributed

        return is_distributed()

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on rank 0 only (flushed: job logs are files, not TTYs)."""
        if self.is_main:
            kwargs.setdefault("flush", True)
            print(*args, **kwargs)

    def log(self, msg: str, *args: Any, level: int = logging.INFO) -> None:
        """Log on rank 0 only through the ``torchhpc.dist`` logger."""
        if self.is_main:
            _ensure_handler()
            _LOG.log(level, msg, *args)

    def barrier(self) -> None:
        """Wait for every rank; a no-op without a process group."""
        from torchhpc.dist.sync import barrier

        barrier()

    def cleanup(self) -> None:
        cleanup()

    # Delegates: the work lives in sibling modules, the context only supplies its device.
    def wrap(self, model: Any, **kwargs: Any) -> Any:
        from torchhpc.dist.ddp import wrap

        kwargs.setdefault("device", self.device)
        return wrap(model, **kwargs)

    def loader(self, dataset: Any, batch_size: int, **kwargs: Any) -> Any:
        from torchhpc.dist.data import loader

        return loader(dataset, batch_size, **kwargs)

    def main_first(self, local: bool = False) -> Any:
        from torchhpc.dist.sync import main_first

        # The context already knows who goes first: no hostname exchange needed.
        return main_first(local=local, first=self.is_local_main if local else self.is_main)

    def tensor_loader(self, *tensors: Any, batch_size: int, **kwargs: Any) -> Any:
        """Whole-dataset tensors on this rank's device, batches sliced by index."""
        from torchhpc.dist.data import TensorLoader

        kwargs.setdefault("device", self.device)
        return TensorLoader(*tensors, batch_size=batch_size, **kwargs)

    def all_reduce_mean(self, tensor: Any) -> Any:
        from torchhpc.dist.sync import all_reduce_mean

        return all_reduce_mean(tensor)

    def average_metrics(self, metrics: Any, weight: float = 1.0) -> dict[str, float]:
        from torchhpc.dist.sync import average_metrics

        return average_metrics(metrics, weight=weight, device=self.device if self.backend == "nccl" else None)

    def seed(self, seed: int, per_rank: bool = True) -> int:
        """Seed python/numpy/torch (plus the rank unless ``per_rank=False``); returns the seed used."""
        from torchhpc.dist.sync import seed_everything

        return seed_everything(seed, per_rank=per_rank)

    def __enter__(self) -> DistContext:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        # After an error a peer may be gone: no farewell barrier then, it could only time out.
        cleanup(barrier=exc_type is None)


def _ensure_handler() -> None:
    """Make rank-0 INFO logs visible in a script that never configured logging."""
    if not logging.getLogger().handlers and not _LOG.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s torchhpc: %(message)s"))
        _LOG.addHandler(handler)
        _LOG.setLevel(logging.INFO)
        _LOG.propagate = False


def init(
    backend: str | None = None,
    timeout: timedelta = DEFAULT_TIMEOUT,
    *,
    device: Any = None,
    env: Mapping[str, str] | None = None,
    single_group: bool = False,
    export_env: bool = True,
) -> DistContext:
    """Detect the launcher, pick device and backend, start the default process group.

    ``backend``: overrides the choice (else ``$TORCHHPC_BACKEND``, else nccl on
    CUDA, gloo otherwise). ``timeout``: for the rendezvous and every
    collective. ``env``: the mapping to detect from (default ``os.environ``).
    ``export_env``: in a multi-process job, also write torch's env contract
    (RANK, LOCAL_RANK, ...) into ``os.environ`` where unset, for code that reads it. Calling ``init``
    twice returns the same context; a group the user already started is
    adopted, not replaced.
    """
    global _CONTEXT
    if _CONTEXT is not None:
        return _CONTEXT
    import torch.distributed as dist

    _one_line_errors()
    environ = os.environ if env is None else env
    dist_env = detect(environ)
    if export_env and dist_env.world_size > 1:
        export(dist_env, os.environ)
    dev = pick_device(dist_env, device)
    owns = False
    if dist.is_available() and dist.is_initialized():
        chosen = str(dist.get_backend())
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        chosen = pick_backend(backend, dev, environ)
        rank, world = dist_env.rank, dist_env.world_size
        if world > 1 or single_group:
            preflight(dist_env, chosen, dev, environ)
            start_group(dist_env, chosen, timeout, environ)
            owns = True
            settle_at_exit()  # gloo's threads may still drop a work after the script ends (dist/teardown.py)
    if "nccl" in chosen and dist.is_available() and dist.is_initialized():
        checkpoint_group()  # made now, by every rank at one point: an async save needs a CPU group beside NCCL
    _CONTEXT = DistContext(
        rank=rank,
        world_size=world,
        local_rank=dist_env.local_rank,
        local_world_size=dist_env.local_world_size,
        node_rank=dist_env.node_rank,
        num_nodes=dist_env.num_nodes,
        device=dev,
        backend=chosen,
        env=dist_env,
        owns_group=owns,
    )
    return _CONTEXT


def _one_line_errors() -> None:
    """An uncaught torchhpc error ends a training script like the CLI ends: ``Error:`` and ``HINT:`` lines.

    Every rank would otherwise print a Python traceback for what is a usage
    problem (two ranks on one GPU). Installed only over Python's default hook;
    other exceptions keep their traceback.
    """
    if sys.excepthook is not sys.__excepthook__ and not getattr(sys.excepthook, "torchhpc_default", False):
        return  # the user's own hook; a warm rank's (boot/warm.py) is the default's, trimmed
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        if isinstance(value, TorchHPCError):
            print(f"Error: {value.message}", file=sys.stderr, flush=True)
            if value.hint:
                print(f"HINT: {value.hint}", file=sys.stderr, flush=True)
        else:
            previous(kind, value, tb)

    sys.excepthook = hook


def checkpoint_group() -> Any:
    """The gloo group that :mod:`torchhpc.dist.checkpoint` talks over; None without a process group.

    A group of its own even where the default one is gloo: an asynchronous save runs its
    collectives on a thread while training runs its own on the main thread, and two threads
    sharing one group would interleave their collectives differently on different ranks. And
    gloo beside NCCL: the save's planning and the async write are CPU work. Made on first use,
    which every rank reaches at one point (``init`` of an NCCL job, else the first save or
    resume); made again after the default group was replaced.
    """
    global _CHECKPOINT_GROUP
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    if _CHECKPOINT_GROUP is not None:
        with contextlib.suppress(KeyError, RuntimeError, ValueError):
            dist.get_process_group_ranks(_CHECKPOINT_GROUP)  # raises for a group destroyed with the default one
            return _CHECKPOINT_GROUP
    _CHECKPOINT_GROUP = dist.new_group(backend="gloo")
    return _CHECKPOINT_GROUP


def current() -> DistContext | None:
    """The context ``init()`` returned, or None before init / after cleanup."""
    return _CONTEXT


def cleanup(barrier: bool = True) -> None:
    """Destroy the process group ``init()`` started (not one the user started). Idempotent.

    With ``barrier`` (the normal end of a run) every rank first meets the
    others, so no rank tears its gloo pairs down while a peer still sends on
    them. Then it waits for gloo's worker threads to settle: a work they drop
    after Python began to shut down aborts the process (dist/teardown.py).
    """
    global _CONTEXT, _CHECKPOINT_GROUP
    ctx, _CONTEXT = _CONTEXT, None
    if ctx is None or not ctx.owns_group:
        return
    run_before_teardown()  # an async checkpoint in flight still talks over the group
    _CHECKPOINT_GROUP = None
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        if barrier and dist.get_world_size() > 1:
            with contextlib.suppress(Exception):  # a peer already gone: tear down anyway
                dist.barrier()
        dist.destroy_process_group()
        gloo_workers_settle()


def _rank() -> int:
    if _CONTEXT is not None:
        return _CONTEXT.rank
    torch_dist = sys.modules.get("torch.distributed")
    if torch_dist is not None and torch_dist.is_available() and torch_dist.is_initialized():
        return int(torch_dist.get_rank())
    try:
        return detect().rank
    except EnvironmentDetectionError:
        return 0


def print0(*args: Any, **kwargs: Any) -> None:
    """``print`` on global rank 0 only; works before, without and after ``init()``."""
    if _rank() == 0:
        kwargs.setdefault("flush", True)
        print(*args, **kwargs)


def log0(msg: str, *args: Any, level: int = logging.INFO) -> None:
    """Log on global rank 0 only (``torchhpc.dist`` logger)."""
    if _rank() == 0:
        _ensure_handler()
        _LOG.log(level, msg, *args)
