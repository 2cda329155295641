"""Each launcher's output tag and its parser, written once.

A launcher that shares one stream among ranks prefixes every line with a tag:
srun ``--label`` writes ``12: ``; torchrun, started one per node by an
``srun --label`` step, ``3: [rank13]: `` (torchhpc's template) or, in logs
written before the template, ``3: [default1]:``; mpirun ``--tag-output`` writes
``[1,12]<stdout>:``. Per-rank files made these tags a fallback (docs/logs.md),
but ``torchhpc logs`` still reads them in older logs and in scripts submitted by
hand. A parser returns ``(rank, text)``: the rank is None for a line the launcher
itself wrote (a label around a container runtime's own message), and the parser
returns None when the line carries none of its tags.
"""

from __future__ import annotations

import re
from typing import Optional

__all__ = ["Tag", "mpirun_tag", "srun_tag", "torchrun_tag"]

# (rank or None, the line without its tag), or None: not a tag of this launcher
Tag = Optional[tuple[Optional[int], str]]

# Patterns as text: re compiles (and caches) them when a log is read, not when a job is submitted.
_SRUN = r"^\s*(\d+): "
_TORCHRUN_RANK = r"^\s*(\d+): \[rank(\d+)\]: ?"
_TORCHRUN_LOCAL = r"^\s*(\d+): \[[A-Za-z_]+?(\d+)\]: ?"  # [default1]: (not the failure summary's [1]:)
_MPI = r"^\[\d+,(\d+)\]<std(?:out|err)>: ?"


def srun_tag(line: str, nproc_per_node: int = 1) -> Tag:
    m = re.match(_SRUN, line)
    return (int(m.group(1)), line[m.end():]) if m else None


def torchrun_tag(line: str, nproc_per_node: int = 1) -> Tag:
    """Under torchrun the srun label is the *node's* task, not a rank: torchrun's own prefix says the rank.

    The old ``[default<local>]:`` gives only the local rank; the global rank is then
    ``task * nproc_per_node + local``, which assumes c10d numbered the nodes in Slurm's
    order (it sorts them by host name: node10 before node2). Every other line is the
    agent's own, whatever its label: torchrun's parser never leaves a line to another's.
    """
    m = re.match(_TORCHRUN_RANK, line)
    if m:
        return int(m.group(2)), line[m.end():]
    m = re.match(_TORCHRUN_LOCAL, line)
    if m:
        return int(m.group(1)) * max(1, nproc_per_node) + int(m.group(2)), line[m.end():]
    m = re.match(_SRUN, line)
    return None, line[m.end():] if m else line


def mpirun_tag(line: str, nproc_per_node: int = 1) -> Tag:
    m = re.match(_MPI, line)
    if m:
        return int(m.group(1)), line[m.end():]
    m = re.match(_SRUN, line)  # an srun --label around a container runtime's own messages
    return (None, line[m.end():]) if m else None
