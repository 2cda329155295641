"""A job's memory-tier checkpoints in each node's shared memory (torchhpc.dist.memtier): where they are, and
removing them when the job ends, so that a node's shared memory is never left full.

The directories are ``$TORCHHPC_SHM_DIR`` (default ``/dev/shm``) ``/torchhpc-<job>-<dir key>/``, ``<job>``
from the scheduler's variables (Slurm's job id, PBS's job number, the local run's id). The local scheduler
removes its run's at the end; the in-allocation supervisor runs ``python -m torchhpc.jobdir.shm JOB`` on
every node of the allocation when it ends (docs/resilience.md).

Before that, :func:`persist` (``python -m torchhpc.jobdir.shm --persist JOB``) writes the newest memory
checkpoint to the checkpoint directory on disk, so that a requeued job or a new one resumes from it, not
from the older disk save: each node copies the parts it holds (its own, and the peer copies of the node
before it, which cover a lost node's ranks) into ``<dir>/.ckpt-<step>.persist.tmp/`` one file at a time, and the
node whose copy completes the file list (``files.json``) renames it to ``ckpt-<step>``, the disk tier's
own name. Stdlib only: the supervisor runs it without torch.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Optional

__all__ = ["DIR_FILE", "FILES", "SHM_ENV", "free", "job_key", "persist", "release", "shm_base"]

SHM_ENV = "TORCHHPC_SHM_DIR"
DIR_FILE = "dir"  # in each tier (torchhpc-<job>-<key>/): the checkpoint directory it stands for
FILES = "files.json"  # in each memory checkpoint: every file the whole checkpoint is made of


def shm_base(environ: Mapping[str, str] = os.environ) -> Path:
    return Path(environ.get(SHM_ENV) or "/dev/shm")


def job_key(environ: Mapping[str, str] = os.environ) -> str:
    """The job's name in the directory: Slurm's or PBS's job id, else the local run's id (``local-<id>``)."""
    for var in ("SLURM_JOB_ID", "PBS_JOBID", "TORCHELASTIC_RUN_ID"):
        if environ.get(var):
            return environ[var].split(".")[0].replace("/", "_")
    return "nojob"


def free(job: Optional[str] = None, base: Optional[str] = None) -> list[str]:
    """Remove every memory tier of ``job`` (default: this process's job) on this machine; the paths removed."""
    root = Path(base) if base else shm_base()
    gone = []
    for d in root.glob(f"torchhpc-{job or job_key()}-*"):
        shutil.rmtree(d, ignore_errors=True)
        gone.append(str(d))
    return gone


def _step(name: str, prefix: str) -> Optional[int]:
    tail = name[len(prefix) + 1:].split(".")[0] if name.startswith(prefix + "-") else ""
    return int(tail) if tail.isdigit() else None


def _disk_steps(directory: Path) -> list[int]:
    return [s for s in (_step(p.name, "ckpt") for p in directory.glob("ckpt-*")) if s is not None]


def _persist_step(directory: Path, step: int, dirs: list[Path]) -> Optional[str]:
    """Copy these directories' files into the step's stage; publish it as ``ckpt-<step>`` once it holds every
    file of the checkpoint. The published path, or None while parts are missing."""
    # a stage a save of the disk tier clears if it is left behind (checkpoint_files.clear_stale: .ckpt-*.tmp)
    stage, final = directory / f".ckpt-{step:09d}.persist.tmp", directory / f"ckpt-{step:09d}"
    stage.mkdir(parents=True, exist_ok=True)
    listing: set[str] = set()
    for d in dirs:
        for f in d.iterdir():
            if f.name == FILES:
                listing |= set(json.loads(f.read_text()))
            if not (stage / f.name).exists():
                tmp = stage / f".{f.name}.{os.getpid()}.tmp"
                shutil.copyfile(f, tmp)
                os.replace(tmp, stage / f.name)  # a file in the stage is always whole
    if listing and listing <= {p.name for p in stage.iterdir()} and not final.exists():
        os.rename(stage, final)  # one node wins; the others find it there (OSError)
        return str(final)
    return None


def persist(job: Optional[str] = None, base: Optional[str] = None) -> list[str]:
    """Write this node's part of each newest memory checkpoint of ``job`` to its directory on disk (see the
    module's docstring); the checkpoints this call completed on disk. A step no newer than the disk's newest
    is left alone, and so is one whose parts were all lost (a node and its peer)."""
    done = []
    for tier in (Path(base) if base else shm_base()).glob(f"torchhpc-{job or job_key()}-*"):
        try:
            directory = Path((tier / DIR_FILE).read_text().strip())
        except OSError:
            continue
        held: dict[int, list[Path]] = {}
        for d in tier.glob("*/*"):
            step = _step(d.name, "ckpt") if d.name.startswith("ckpt-") else _step(d.name, "peer")
            if step is not None and d.is_dir():
                held.setdefault(step, []).append(d)
        newest = max(_disk_steps(directory), default=-1)
        for step in sorted((s for s in held if s > newest), reverse=True):  # the newest complete one
            try:
                path = _persist_step(directory, step, held[step])
            except OSError:  # another node finished it, or removed its stage
                path = None
            if path:
                done.append(path)
                break
        # stages not newer than the disk's newest are no longer needed. The disk is read again: it holds what this
        # node published, and what another node published while this one copied into a stage it then clears
        newest = max(_disk_steps(directory), default=-1)
        for stage in directory.glob(".ckpt-*.persist.tmp"):
            if (_step(stage.name[1:], "ckpt") or 0) <= newest:
                shutil.rmtree(stage, ignore_errors=True)
    return done


def release(job: str, base: Optional[str] = None) -> None:
    """The end of a job on this machine (the local scheduler's): its newest memory checkpoint to disk, said on
    stderr, then its memory tier removed. Never raises: the job's own end comes first."""
    try:
        for path in persist(job, base):
            print(f"torchhpc: the memory tier's newest checkpoint is on disk: {path}", file=sys.stderr, flush=True)
    except (OSError, ValueError) as e:
        print(f"torchhpc: could not write the memory-tier checkpoint to disk: {e}", file=sys.stderr, flush=True)
    free(job, base)


if __name__ == "__main__":  # run on each node by the supervisor at the job's end: stdlib only, no torch
    args = sys.argv[1:]
    if args[:1] == ["--persist"]:
        for path in persist(args[1] if len(args) > 1 else None):
            print(f"torchhpc: the memory tier's newest checkpoint is on disk: {path}", flush=True)
    else:
        free(args[0] if args else None)
