"""The memory tier of :mod:`torchhpc.dist.checkpoint`: the newest checkpoint in each node's shared memory,
each rank's part copied to a rank on another node in the background, so a restart (the same nodes, or the
survivors of a node loss) resumes from memory instead of from the last checkpoint on disk.

    checkpoint.save(ckpt_dir, step=step, model=model, optimizer=opt, tier="memory")   # every step: cheap
    checkpoint.save(ckpt_dir, step=step, model=model, optimizer=opt)                  # every k steps: disk
    state = checkpoint.resume(ckpt_dir, model=model, optimizer=opt)   # the newest of memory, a peer's, disk

Layout, per node: ``$TORCHHPC_SHM_DIR`` (default ``/dev/shm``) ``/torchhpc-<job>-<dir key>/<node>/``, with

* ``ckpt-NNNNNNNNN/``: this node's ranks' DCP files of the newest memory save, DCP's ``.metadata`` and
  torchhpc's ``torchhpc.pt`` (step, world size, RNG states, the loader's place, the list of every rank's
  files), written by the same protocol as the disk tier (a temporary name, renamed when complete);
* ``peer-NNNNNNNNN.to-R/``: the files of the ranks whose copy rank R of this node keeps (the previous
  node's, in the allocation's order), complete when renamed from its temporary name;
* ``files.json`` in each checkpoint (every file of the whole checkpoint) and ``../dir`` (the checkpoint
  directory), for the supervisor's write to disk at the job's end (``jobdir/shm.persist``, no torch);
* ``.resume-NNNNNNNNN/``: what a resume read: links to the two above and the parts other nodes sent
  (removed at the next save).

Two copies of a rank's part are kept (its own node's newest, and one peer's). A node's older own checkpoint
is removed once every peer copy of the newer one is complete (a loss during the copy leaves the step before
whole), an older peer copy once its newer one is: a node's shared memory holds two checkpoints' worth, and
four while a save is in flight.
``<node>`` is the host name (``$TORCHHPC_NODE_NAME`` where a test runs several "nodes" on one machine), so
"nodes" that share one ``/dev/shm`` keep apart as real nodes do (the dev cluster gives each its own).

The peer copy runs on a thread over a gloo group of its own, and the next memory save waits for it: a copy
is complete before the next one starts. :func:`resume_memory` takes the newest step whose files the nodes
hold between them (own and peer copies), sends each node what it lacks over the checkpoint group, and
reads it with DCP, resharded to the world it runs in; it says where the files came from.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import torchhpc.dist.checkpoint_state as cs
from torchhpc.jobdir.shm import DIR_FILE, FILES, free, job_key, shm_base

__all__ = ["MemoryTier", "free", "node_name", "resume_memory", "tier_root"]

NODE_ENV = "TORCHHPC_NODE_NAME"
META = "torchhpc.pt"
DCP_META = ".metadata"
SMALL = 1 << 20  # bytes: a file up to this size travels in the peer copy's header


def node_name() -> str:
    return os.environ.get(NODE_ENV) or socket.gethostname()


def tier_root(directory: str | os.PathLike[str]) -> Path:
    """This node's memory tier for checkpoints of ``directory`` in this job (jobdir/shm.py: where, and freed)."""
    key = hashlib.sha1(os.path.abspath(os.fspath(directory)).encode()).hexdigest()[:10]
    return shm_base() / f"torchhpc-{job_key()}-{key}" / node_name()


def _step_dirs(root: Path, prefix: str) -> dict[int, list[Path]]:
    """step -> its directories of this kind (``peer-N.from-R``: one per rank whose copy this node keeps)."""
    out: dict[int, list[Path]] = {}
    for d in root.glob(f"{prefix}-*"):
        tail = d.name[len(prefix) + 1:].split(".")[0]
        if tail.isdigit() and d.is_dir():
            out.setdefault(int(tail), []).append(d)
    return out


def _drop_older(root: Path, prefix: str, keep: int) -> None:
    for step, dirs in _step_dirs(root, prefix).items():
        if step != keep:
            for d in dirs:
                shutil.rmtree(d, ignore_errors=True)


class MemoryTier:
    """What one process's memory saves share: the node map, the peer group, the copy in flight."""

    def __init__(self) -> None:
        self._copy: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None
        self._peer_pg: Any = None
        self._nodes: Optional[list[str]] = None
        self._stager: Any = None  # DCP's stager: its host buffers, kept between saves

    # -- the node map ------------------------------------------------------------------------------------
    def _map(self, pg: Any) -> list[str]:
        if self._nodes is None:
            self._nodes = [str(n) for n in cs.gather(node_name(), pg)]
        return self._nodes

    @staticmethod
    def peer_of(nodes: list[str], rank: int) -> Optional[int]:
        """The rank on the next node (in first-appearance order) that keeps ``rank``'s copy; None on one node."""
        order = list(dict.fromkeys(nodes))
        if len(order) < 2:
            return None
        here = order.index(nodes[rank])
        there = order[(here + 1) % len(order)]
        mine = [r for r, n in enumerate(nodes) if n == nodes[rank]]
        theirs = [r for r, n in enumerate(nodes) if n == there]
        return theirs[mine.index(rank) % len(theirs)]

    # -- save --------------------------------------------------------------------------------------------
    def wait(self) -> None:
        """Until the save in flight (its write into memory and its peer copy) is complete; its error, if it failed."""
        if self._copy is not None:
            self._copy.join()
            self._copy = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def save(self, directory: str | os.PathLike[str], step: int, state: dict[str, Any], meta: dict[str, Any],
             pg: Any, done: Optional[Callable[[], None]] = None) -> Path:
        """Copy ``state`` into host buffers (the pause: one copy of this rank's share) and return; a thread then
        writes it into this node's memory as checkpoint ``step`` and copies each rank's part to its peer, over a
        group of its own. Every rank calls it. Returns the directory this node's copy will have; ``done`` is called
        on the thread once this node's copy is complete."""
        self.wait()
        rank, world = cs.rank_world()
        nodes = self._map(pg)
        if world > 1 and self._peer_pg is None:
            import torch.distributed as dist

            self._peer_pg = dist.new_group(backend="gloo")  # collective: every rank is here, on its main thread
        root = tier_root(directory)
        if world > 1:
            state = cs.share(state, rank, world)  # a replicated tensor is written (and copied) by one rank
        self._stager = cs.stager(self._stager)
        staged = self._stager.stage(state)
        args = (os.path.abspath(os.fspath(directory)), step, staged, meta, nodes, root, rank, world, done)

        def work() -> None:
            try:
                self._write(*args)
            except BaseException as e:  # said at the next save or resume
                self._error = e

        self._copy = threading.Thread(target=work, name="torchhpc-memory-save", daemon=True)
        self._copy.start()
        return root / f"ckpt-{step:09d}"

    def _write(self, directory: str, step: int, staged: dict[str, Any], meta: dict[str, Any], nodes: list[str],
               root: Path, rank: int, world: int, done: Optional[Callable[[], None]]) -> None:
        """On the save's thread: this node's checkpoint in shared memory (a temporary name, renamed when every
        rank's part and DCP's ``.metadata`` are there), then the peer copies; collectives on the tier's group."""
        pg = self._peer_pg
        final, tmp = root / f"ckpt-{step:09d}", root / f".ckpt-{step:09d}.tmp"
        first = nodes.index(nodes[rank]) == rank  # this node's first rank tidies and publishes
        if first:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True, exist_ok=True)
            for old in root.glob(".resume-*"):  # what a resume assembled: read, no longer needed
                shutil.rmtree(old, ignore_errors=True)
        cs.barrier(pg)
        cs.write(staged, tmp, pg)  # each rank its own file into its node's memory; .metadata on rank 0's node
        mine = sorted(p.name for p in tmp.glob(f"__{rank}_*"))
        every = cs.gather(mine, pg)
        blob = (tmp / DCP_META).read_bytes() if rank == 0 else b""
        shared = cs.gather(blob, pg)[0]  # DCP's .metadata to every node
        if first:
            if not (tmp / DCP_META).exists():
                (tmp / DCP_META).write_bytes(shared)
            cs.write_file(tmp / META, {**meta, "files": sorted(f for fs in every for f in fs)})
            # what jobdir/shm.persist (no torch) checks a checkpoint's parts against, and where it writes them
            (tmp / FILES).write_text(json.dumps(sorted({f for fs in every for f in fs} | {META, DCP_META, FILES})))
            if not (root.parent / DIR_FILE).exists():
                (root.parent / DIR_FILE).write_text(directory)
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
        cs.barrier(pg)
        if done is not None:
            done()
        if world > 1 and len(set(nodes)) > 1:
            to = self.peer_of(nodes, rank)
            sources = [r for r in range(len(nodes)) if self.peer_of(nodes, r) == rank]
            _exchange({name: final / name for name in (*mine, DCP_META, META, FILES)}, to, sources, step, root, pg)
            cs.barrier(pg)
        # Only now, every peer copy of this step complete, are this node's older checkpoint and older peer copies of
        # no use: a node lost during the copy leaves the survivors their own step-1 beside its ranks' peer copies of
        # step-1, every one of them (a rank whose own receive was done dropped its step-1 copy before: run 35).
        if first:
            _drop_older(root, "ckpt", step)
            _drop_older(root, "peer", step)


def _exchange(files: dict[str, Path], to: Optional[int], sources: list[int], step: int, root: Path,
              pg: Any) -> None:
    """Send this rank's ``files`` to ``to``; receive the files of ``sources`` into ``root/peer-<step>``.

    A file goes as itself: mapped from this node's shared memory on the way out and received straight into
    a file mapped in the peer's (``torch.from_file``), so the only copies are gloo's; a pickled payload cost
    six more of the state and held the GIL meanwhile. The small files (DCP's ``.metadata``, ``torchhpc.pt``,
    ``files.json``) travel in the header."""
    import pickle

    import torch
    import torch.distributed as dist

    sending = []
    if to is not None:
        sizes = {name: path.stat().st_size for name, path in files.items()}
        small = {name: path.read_bytes() for name, path in files.items() if sizes[name] <= SMALL}
        big = [(name, sizes[name]) for name in sorted(files) if name not in small]
        head = torch.frombuffer(bytearray(pickle.dumps((small, big))), dtype=torch.uint8)
        sending = [dist.isend(torch.tensor([head.numel()], dtype=torch.int64), to, group=pg, tag=0),
                   dist.isend(head, to, group=pg, tag=1)]
        for i, (name, size) in enumerate(big):
            data = torch.from_file(str(files[name]), shared=True, size=size, dtype=torch.uint8)
            sending.append(dist.isend(data, to, group=pg, tag=2 + i))
    me = dist.get_rank()
    tmp = root / f".peer-{step:09d}.{me}.tmp"  # one directory per receiving rank: ranks of a node never rename over each other
    if sources:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True, exist_ok=True)
    for s in sorted(sources):
        size_t = torch.zeros(1, dtype=torch.int64)
        dist.recv(size_t, s, group=pg, tag=0)
        head = torch.empty(int(size_t.item()), dtype=torch.uint8)
        dist.recv(head, s, group=pg, tag=1)
        small, big = pickle.loads(head.numpy().tobytes())
        for name, blob in small.items():
            (tmp / name).write_bytes(blob)
        for i, (name, size) in enumerate(big):
            with open(tmp / name, "wb") as f:
                f.truncate(size)
            dist.recv(torch.from_file(str(tmp / name), shared=True, size=size, dtype=torch.uint8), s, group=pg, tag=2 + i)
    for work in sending:
        if work is not None:
            work.wait()
    if sources:
        final = root / f"peer-{step:09d}.to-{me}"
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)


def _inventory(root: Path) -> dict[int, dict[str, list[str]]]:
    """step -> {"own": files, "peer": files} of this node's complete copies."""
    out: dict[int, dict[str, list[str]]] = {}
    for kind in ("ckpt", "peer"):
        for step, dirs in _step_dirs(root, kind).items():
            out.setdefault(step, {})["own" if kind == "ckpt" else "peer"] = sorted({p.name for d in dirs for p in d.iterdir()})
    return out


def resume_memory(directory: str | os.PathLike[str], pg: Any) -> Optional[tuple[int, Path, str]]:
    """(step, this node's complete checkpoint directory, where it came from: ``memory`` or ``peer``) of the
    newest memory checkpoint the nodes hold between them; None when there is none. Every rank calls it."""
    import torch
    import torch.distributed as dist

    rank, _world = cs.rank_world()
    root = tier_root(directory)
    every = cs.gather((node_name(), _inventory(root)), pg)
    steps = sorted({s for _n, inv in every for s in inv}, reverse=True)
    for step in steps:
        held = {n: set(inv.get(step, {}).get("own", [])) | set(inv.get(step, {}).get("peer", [])) for n, inv in every}
        listing = None  # the files the checkpoint is made of, as its META lists them
        if META in held[node_name()]:
            src = next(d / META for ds in (_step_dirs(root, "ckpt").get(step, []), _step_dirs(root, "peer").get(step, []))
                       for d in ds if (d / META).exists())
            listing = torch.load(src, map_location="cpu", weights_only=False).get("files")
        lists = [x for x in cs.gather(listing, pg) if x is not None]
        if not lists:
            continue
        files = set(lists[0]) | {META, DCP_META}
        if not files <= set().union(*held.values()):
            continue  # a part was lost with its node and its peer: not resumable from memory
        here = root / f".resume-{step:09d}"  # read from here; this node's copies stay as they were saved
        first = [n for n, _i in every].index(node_name()) == rank
        if first:
            shutil.rmtree(here, ignore_errors=True)
            here.mkdir(parents=True)
            for kind in ("ckpt", "peer"):  # links: the same memory, no second copy
                for d in _step_dirs(root, kind).get(step, []):
                    for f in d.iterdir():
                        if not (here / f.name).exists():
                            os.link(f, here / f.name)
        own_all = set().union(*(set(inv.get(step, {}).get("own", [])) for _n, inv in every))
        for name in sorted(f for f in files if any(f not in held[n] for n in held)):  # sent to the nodes lacking it
            holder = next(r for r, (n, _i) in enumerate(every) if name in held[n])
            data = b""
            if rank == holder:
                data = (here / name).read_bytes()  # linked above, by this node's first rank
            size = torch.tensor([len(data)], dtype=torch.int64)
            dist.broadcast(size, holder, group=pg)
            buf = torch.frombuffer(bytearray(data), dtype=torch.uint8) if rank == holder and data \
                else torch.empty(int(size.item()), dtype=torch.uint8)
            dist.broadcast(buf, holder, group=pg)
            if first and name not in held[node_name()]:
                (here / name).write_bytes(buf.numpy().tobytes())
        cs.barrier(pg)
        # "peer": a part survived only as another node's copy (its own node was lost)
        return step, here, "memory" if files <= own_all else "peer"
    return None
