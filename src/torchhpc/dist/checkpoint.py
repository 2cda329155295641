"""Checkpoints that are right under DDP and FSDP, complete or absent, and resumable bit for bit.

    state = checkpoint.resume(ckpt_dir, model=model, optimizer=opt)   # {} on a fresh start
    step = state.get("step", 0)
    ...
    checkpoint.save(ckpt_dir, step=step, model=model, optimizer=opt, epoch=epoch)
    checkpoint.save_async(ckpt_dir, step=step, model=model, optimizer=opt)  # training goes on

Every rank writes its own part through torch.distributed.checkpoint (DCP): a plain
model, DDP (a replicated tensor is written once) and FSDP2 (each rank its shards)
alike, and ``resume`` reshards to the world it runs in (saved by 4 ranks, resumed
by 2 or 3). All ranks call ``save`` and ``resume``.

A checkpoint is a directory ``ckpt-NNNNNNNNN/``: DCP's files, ``.metadata`` last,
and ``torchhpc.pt`` (step, world size, every rank's RNG states, the scheduler, the
extra keys). It is written as ``.ckpt-NNNNNNNNN.<token>.tmp/``; once every rank's
write is done (DCP's closing collective) rank 0 fsyncs it, renames it into place
and fsyncs the directory. So a name ``ckpt-…`` always means complete, a kill at any
moment leaves the previous checkpoint whole, and :func:`latest`,
:func:`list_checkpoints`, :func:`resume` and ``<job dir>/checkpoint.json`` (the
supervisor's no-progress stop) see completed checkpoints only. A checkpoint
dropped by ``keep`` is first renamed away, then deleted.

:func:`save_async` (or ``save(blocking=False)``) returns an :class:`AsyncSave` at once after copying the state
to host buffers (kept between saves, so host memory stays flat); the write runs
on a thread over a gloo group of its own (:func:`torchhpc.dist.context.checkpoint_group`,
also beside NCCL). At most one save is in flight: the next ``save``, ``resume``,
:func:`torchhpc.dist.cleanup` and the end of the process wait for it.

Single-file checkpoints ``ckpt-NNNNNNNNN.pt`` from before DCP still resume; the
newest of either kind wins. A checkpoint that fails to load on any rank is skipped
by every rank for the one before it.

The files (names, publish, prune, ``checkpoint.json``) are :mod:`torchhpc.dist.checkpoint_files`'s;
the calls into torch are :mod:`torchhpc.dist.checkpoint_state`'s.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torchhpc.dist.checkpoint_state as cs
from torchhpc.dist.checkpoint_files import META, clear_stale, entries, latest, list_checkpoints, publish, tell_supervisor
from torchhpc.errors import UsageError

__all__ = ["META", "AsyncSave", "Checkpointer", "default", "latest", "list_checkpoints", "resume", "save", "save_async", "wait"]


class AsyncSave:
    """A save in flight (:func:`save_async`). :meth:`wait` returns once every rank's write is
    done and, on rank 0, the checkpoint is in place; it returns the checkpoint's path on rank 0
    (None elsewhere) and raises the save's error."""

    def __init__(self, step: int, path: Path | None) -> None:
        self.step, self.path = step, path
        self._done = threading.Event()
        self._error: BaseException | None = None

    def _finish(self, error: BaseException | None) -> None:
        self._error = error
        self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> Path | None:
        if not self._done.wait(timeout):
            raise TimeoutError(f"checkpoint of step {self.step} still being written after {timeout} s")
        if self._error is not None:
            raise self._error
        return self.path

    def __repr__(self) -> str:
        return f"AsyncSave(step={self.step}, done={self.done()})"


class Checkpointer:
    """What one process's saves share, in one object (torchtitan's CheckpointManager holds the same): the
    save in flight, DCP's stager (its host buffers, kept between saves), the memory tier (its peer group and
    copy in flight), and the exit hook that waits for them. The module's :func:`save`, :func:`save_async`,
    :func:`resume` and :func:`wait` are the process-wide instance's (:func:`default`)."""

    def __init__(self) -> None:
        self._pending: AsyncSave | None = None
        self._stager: Any = None
        self._tier: Any = None
        self._at_exit = False

    def wait(self) -> Path | None:
        """Wait for the save in flight, if any (raising its error once), and for a memory save's peer copy;
        returns what the disk save's ``wait()`` returns."""
        if self._tier is not None:
            self._tier.wait()
        pending, self._pending = self._pending, None
        return pending.wait() if pending is not None else None

    def memory(self) -> Any:
        """The memory tier (torchhpc.dist.memtier): its peer group and copy in flight, made at the first use."""
        if self._tier is None:
            from torchhpc.dist.memtier import MemoryTier

            self._tier = MemoryTier()
        return self._tier

    def save(self, directory: str | os.PathLike[str], *, step: int, model: Any = None, optimizer: Any = None,
             scheduler: Any = None, loader: Any = None, keep: int = 3, tier: str = "disk", **extra: Any) -> Path | None:
        """Write checkpoint ``step`` and return when it is in place (all ranks call it): its path on rank 0, None
        elsewhere; ``tier="memory"``: this node's copy in shared memory (see the module's docstring)."""
        if tier not in ("disk", "memory"):
            raise UsageError(f"checkpoint.save(tier={tier!r}): no such tier", "tier='disk' (the default) or tier='memory'")
        pg, rank, meta = self._begin(step, model, optimizer, scheduler, loader, extra)
        if tier == "memory":  # returns after the copy to host memory; the process's end waits for the rest
            self._watch_exit()
            told = (lambda: tell_supervisor(step, None, "memory")) if rank == 0 else None
            where: Path = self.memory().save(directory, step, cs.state_of(model, optimizer), meta, pg, done=told)
            return where
        tmp, final = self._stage(Path(directory), step, rank, meta)
        cs.write(cs.state_of(model, optimizer), tmp, pg)
        path = publish(tmp, final, step, keep) if rank == 0 else None
        cs.barrier(pg)  # every rank sees the new checkpoint when save returns
        return path

    def save_async(self, directory: str | os.PathLike[str], *, step: int, model: Any = None, optimizer: Any = None,
                   scheduler: Any = None, loader: Any = None, keep: int = 3, **extra: Any) -> AsyncSave:
        """Copy the state to host buffers and return (training may step on); the write runs on a thread, at most
        one in flight: the next save, :meth:`resume`, ``torchhpc.dist.cleanup`` and the process's end wait for it."""
        pg, rank, meta = self._begin(step, model, optimizer, scheduler, loader, extra)
        tmp, final = self._stage(Path(directory), step, rank, meta)
        handle = AsyncSave(step, final if rank == 0 else None)
        self._stager = cs.stager(self._stager)
        future = cs.write_async(cs.state_of(model, optimizer), tmp, pg, self._stager)  # after the copy to host memory

        def finished(f: Any) -> None:  # on the writer's thread
            try:
                f.result()
                if rank == 0:
                    publish(tmp, final, step, keep)
            except BaseException as e:
                handle._finish(e)
            else:
                handle._finish(None)

        self._watch_exit()
        self._pending = handle
        future.add_done_callback(finished)
        return handle

    def _begin(self, step: int, model: Any, optimizer: Any, scheduler: Any, loader: Any,
               extra: dict[str, Any]) -> tuple[Any, int, dict[str, Any]]:
        """Wait for the save in flight, then one small collective: every rank's RNG state, and rank 0's
        token for this save's temporary name. (group, rank, the checkpoint's own record)."""
        if optimizer is not None and model is None:
            raise UsageError("checkpoint.save(optimizer=...) without model=", "pass the model the optimizer trains")
        self.wait()
        pg = cs.group()
        rank, world = cs.rank_world()
        every = cs.gather({"rng": cs.rng_state(), "token": f"{os.getpid():x}{time.time_ns():x}"}, pg)
        return pg, rank, {
            "step": step, "world_size": world, "rng": [e["rng"] for e in every], "extra": extra,
            "scheduler": None if scheduler is None else scheduler.state_dict(),
            "loader": None if loader is None else loader.state_dict(),
            "parts": [k for k, v in (("model", model), ("optim", optimizer)) if v is not None],
            "token": every[0]["token"],
        }

    @staticmethod
    def _stage(d: Path, step: int, rank: int, meta: dict[str, Any]) -> tuple[Path, Path]:
        """The checkpoint's temporary directory (made by rank 0, with torchhpc's record in it) and final name."""
        final = d / f"ckpt-{step:09d}"
        tmp = d / f".{final.name}.{meta['token']}.tmp"
        if rank == 0:
            d.mkdir(parents=True, exist_ok=True)
            clear_stale(d, keep=tmp)
            tmp.mkdir(exist_ok=True)  # another rank's writer may have made it already
            cs.write_file(tmp / META, {k: v for k, v in meta.items() if k != "token"})
        return tmp, final

    def _watch_exit(self) -> None:
        """Make cleanup() and the interpreter's exit wait for the save in flight (registered once)."""
        if not self._at_exit:
            from torchhpc.dist.teardown import before_teardown

            self._at_exit = True
            atexit.register(self._wait_at_exit)  # after init's own exit handler, so it runs before it
            before_teardown(self._wait_at_exit)

    def _wait_at_exit(self) -> None:
        try:
            self.wait()
        except Exception as e:  # the process ends anyway: say so rather than raise into the interpreter's exit
            print(f"torchhpc: the last asynchronous checkpoint failed: {type(e).__name__}: {e}", file=sys.stderr,
                  flush=True)

    def resume(self, directory: str | os.PathLike[str], *, model: Any = None, optimizer: Any = None,
               scheduler: Any = None, loader: Any = None) -> dict[str, Any]:
        """Restore the newest complete checkpoint; ``{}`` when there is none (all ranks call it).

        Returns ``{"step": ..., "path": ..., "world_size": the saver's, "tier": where from, **extra}``. Each rank
        gets its own RNG states back when the world size is the one saved; in another world rank r takes saved
        rank r mod W's. ``loader`` goes on from the saved place in the data, on this world's ranks.
        """
        had = self._pending is not None
        self.wait()
        pg = cs.group()
        if had:
            cs.barrier(pg)  # rank 0 put it in place; now every rank lists it
        rank, _ = cs.rank_world()
        self.memory().wait()
        from torchhpc.dist.memtier import resume_memory

        found = resume_memory(directory, pg)  # the newest memory checkpoint the nodes hold between them
        on_disk = list_checkpoints(directory)
        newest = entries(Path(directory))[-1][0] if on_disk else -1
        candidates = [(p, "disk") for p in on_disk]
        if found is not None and found[0] >= newest:
            candidates.append((found[1], found[2]))  # tried first: as new as the disk's newest, and in memory
        for path, tier in reversed(candidates):
            meta: dict[str, Any] = {}
            why = "it could not be read on another rank"
            try:
                if path.is_dir():
                    import torch

                    meta = torch.load(path / META, map_location="cpu", weights_only=False)
                    parts = meta.get("parts", ("model", "optim"))  # what was saved: a model alone resumes as before
                    state = cs.state_of(model if "model" in parts else None, optimizer if "optim" in parts else None)
                    if state:
                        cs.read(state, path, pg)
                        cs.apply_state(model, optimizer, state)
                    if scheduler is not None and meta.get("scheduler") is not None:
                        scheduler.load_state_dict(meta["scheduler"])
                    if loader is not None and meta.get("loader") is not None:
                        loader.load_state_dict(meta["loader"])
                else:
                    from torchhpc.dist.checkpoint_legacy import load as load_single_file

                    meta = load_single_file(path, model, optimizer, scheduler)
                ok = True
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as e:  # damaged outside our control, or unreadable here (DCP's error is a BaseException)
                ok, lines = False, str(e).strip().splitlines()
                why = f"{type(e).__name__}: {lines[0] if lines else ''}"
            if not cs.agree(ok, pg):
                if rank == 0:
                    print(f"torchhpc: checkpoint {path} not loaded ({why}); trying the one before", file=sys.stderr, flush=True)
                continue
            rngs = meta.get("rng") or []
            if rngs:
                cs.set_rng_state(rngs[rank % len(rngs)])
            if rank == 0:
                print(f"torchhpc: resumed step {meta['step']} from {_FROM[tier]}: {path}", file=sys.stderr, flush=True)
                tell_supervisor(int(meta["step"]), None, tier, resumed=True)
            return {"step": meta["step"], "path": str(path), "world_size": meta.get("world_size"), "tier": tier,
                    **(meta.get("extra") or {})}
        return {}


_FROM = {"memory": "this node's memory", "peer": "the memory copies of the nodes left (a peer's)", "disk": "disk"}
_DEFAULT = Checkpointer()


def default() -> Checkpointer:
    """The process-wide :class:`Checkpointer` the module's functions use."""
    return _DEFAULT


def save(directory: str | os.PathLike[str], *, step: int, model: Any = None, optimizer: Any = None, scheduler: Any = None,
         loader: Any = None, keep: int = 3, blocking: bool = True, tier: str = "disk", **extra: Any) -> Any:
    """Write checkpoint ``step`` (all ranks call it); keep the newest ``keep`` (0: all).

    Returns the checkpoint's path on rank 0 and None elsewhere; with ``blocking=False`` (or
    :func:`save_async`) an :class:`AsyncSave` at once (the state is copied first: training may step on).
    ``extra`` keys (picklable, e.g. ``epoch=3``) come back from :func:`resume`. ``loader``: a loader of
    :mod:`torchhpc.dist.data` (or anything with ``state_dict``), whose place in the data is the job's,
    so a resume on another world size deals the rest of the epoch to the ranks it has. ``tier="memory"``:
    into each node's shared memory, each rank's part copied to a rank on another node in the background
    (:mod:`torchhpc.dist.memtier`); returns this node's copy. The disk tier stays, at its own interval.
    """
    kw = dict(step=step, model=model, optimizer=optimizer, scheduler=scheduler, loader=loader, keep=keep, **extra)
    if not blocking and tier == "disk":
        return _DEFAULT.save_async(directory, **kw)
    return _DEFAULT.save(directory, tier=tier, **kw)


def save_async(directory: str | os.PathLike[str], *, step: int, model: Any = None, optimizer: Any = None,
               scheduler: Any = None, loader: Any = None, keep: int = 3, **extra: Any) -> AsyncSave:
    """:meth:`Checkpointer.save_async` of the process-wide instance."""
    return _DEFAULT.save_async(directory, step=step, model=model, optimizer=optimizer, scheduler=scheduler,
                               loader=loader, keep=keep, **extra)


def resume(directory: str | os.PathLike[str], *, model: Any = None, optimizer: Any = None, scheduler: Any = None,
           loader: Any = None) -> dict[str, Any]:
    """Restore the newest complete checkpoint, ``{}`` when there is none: :meth:`Checkpointer.resume` of the
    process-wide instance (its docstring says what comes back)."""
    return _DEFAULT.resume(directory, model=model, optimizer=optimizer, scheduler=scheduler, loader=loader)


def wait() -> Path | None:
    """:meth:`Checkpointer.wait` of the process-wide instance."""
    return _DEFAULT.wait()
