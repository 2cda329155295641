"""The checkpoint directory of :mod:`torchhpc.dist.checkpoint`: which names are complete, how one is put in place.

Kept apart so that the checkpoint module reads as the save and resume protocol
(the collectives, the async writer, the memory tier) and this one as the files:
the names a complete checkpoint carries (``ckpt-NNNNNNNNN/`` with ``.metadata`` and
:data:`META`, or the old ``ckpt-NNNNNNNNN.pt``), the rename into place with its
fsyncs, the keep-K pruning that never leaves a half-deleted checkpoint under a
complete name, and ``<job dir>/checkpoint.json``, where the supervisor and
``torchhpc events`` read of completed saves and resumes. No torch here.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import time
from pathlib import Path

__all__ = ["META", "clear_stale", "entries", "latest", "list_checkpoints", "publish", "tell_supervisor"]

META = "torchhpc.pt"  # beside DCP's files: step, world size, RNG states, scheduler, extra keys
_DIR = re.compile(r"^ckpt-(\d{9})$")
_FILE = re.compile(r"^ckpt-(\d{9})\.pt$")  # the single-file kind, written before DCP
_HISTORY = 64  # completions kept in checkpoint.json (torchhpc events' account reads them)


def entries(d: Path) -> list[tuple[int, int, Path]]:
    """(step, kind, path) of every complete checkpoint in ``d``, oldest first (kind 1: a DCP directory, 0: a file)."""
    out: list[tuple[int, int, Path]] = []
    try:
        names = os.listdir(d)
    except OSError:
        return out
    for name in names:
        p = d / name
        m = _DIR.match(name)
        if m and (p / ".metadata").is_file() and (p / META).is_file():
            out.append((int(m.group(1)), 1, p))  # at one step the directory sorts after the file: it wins
            continue
        m = _FILE.match(name)
        if m and p.is_file():
            out.append((int(m.group(1)), 0, p))
    return sorted(out)


def list_checkpoints(directory: str | os.PathLike[str]) -> list[Path]:
    """The complete checkpoints in ``directory``, oldest first (both kinds)."""
    return [p for _, _, p in entries(Path(directory))]


def latest(directory: str | os.PathLike[str]) -> Path | None:
    ckpts = list_checkpoints(directory)
    return ckpts[-1] if ckpts else None


def fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def discard(p: Path) -> None:
    """Remove a checkpoint so that no half-deleted one ever carries a complete name."""
    if p.is_dir():
        aside = p.with_name(f".{p.name}.{os.getpid()}.del")
        os.replace(p, aside)
        shutil.rmtree(aside, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)


def clear_stale(d: Path, keep: Path) -> None:
    """Temporary and half-deleted entries of saves that were killed (ours and the old helper's)."""
    for p in d.glob(".ckpt-*"):
        if p != keep and (p.name.endswith((".tmp", ".del")) or ".pt.tmp-" in p.name):
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


def publish(tmp: Path, final: Path, step: int, keep: int) -> Path:
    """Rank 0, once every rank's write is done: make the checkpoint visible, tell, prune."""
    fsync_dir(tmp)
    if final.exists():  # the same step saved again (a rerun): the new one replaces it
        discard(final)
    os.replace(tmp, final)
    fsync_dir(final.parent)
    tell_supervisor(step, final)
    for old in list_checkpoints(final.parent)[:-keep] if keep > 0 else []:
        discard(old)
    return final


def tell_supervisor(step: int, path: Path | None, tier: str = "disk", resumed: bool = False) -> None:
    """``<job dir>/checkpoint.json``: the newest step, for the supervisor's no-progress stop
    (torchhpc.supervisor.progress); the last completions (step, time, tier) and resumes (time, step, where
    from) for ``torchhpc events``' account (steps lost per incident). ``path``: the disk tier's newest (kept
    as it was by a memory save). Only inside a torchhpc job; a courtesy that never fails a save."""
    import json

    from torchhpc.jobdir.layout import CHECKPOINT, job_dir_of, read_json

    job_dir = job_dir_of()
    if not job_dir or not os.path.isdir(job_dir):
        return
    marker = os.path.join(job_dir, CHECKPOINT)
    now = time.time()
    old = read_json(marker)
    old = old if isinstance(old, dict) else {}
    history = [list(x) for x in old.get("completed") or []][-(_HISTORY - 1):]
    resumes = [list(x) for x in old.get("resumed") or []][-(_HISTORY - 1):]
    if resumed:
        new = {**old, "resumed": [*resumes, [now, step, tier]]}
    else:
        new = {**old, "step": step, "time": now, "completed": [*history, [step, now, tier]]}
        new["path"] = str(path) if tier == "disk" and path is not None else old.get("path", "")
    tmp = f"{marker}.{os.getpid()}.tmp"
    with contextlib.suppress(OSError):
        with open(tmp, "w") as f:
            json.dump(new, f)
        os.replace(tmp, marker)
