"""What the Slurm backend answers about nodes: GPUs per node (GRES), node names, the allocation.

Asked through the scheduler (:meth:`~torchhpc.schedulers.api.Scheduler.preflight`, ``node_names``;
a job's own nodes: slurm/allocation.py), so no caller parses ``sinfo`` itself.
"""

from __future__ import annotations

import re

from torchhpc.core.proc import Runner
from torchhpc.core.spec import JobSpec
from torchhpc.errors import CommandError, SpecError

__all__ = ["check_gpus", "gres_gpus", "node_names"]


def gres_gpus(gres: str) -> int:
    """GPUs per node in a sinfo GRES field: ``gpu:4``, ``gpu:a100:4(S:0-1)``, ``gpu:h100:4,shard:8``; 0 for ``(null)``."""
    found = (re.match(r"^gpu(?::[^:(]+)?:(\d+)", item.strip()) for item in gres.split(","))
    return max((int(m.group(1)) for m in found if m), default=0)


def check_gpus(spec: JobSpec, runner: Runner) -> None:
    """Refuse GPUs per node that the Slurm partition does not have, from ``sinfo`` (skipped when it cannot be asked).

    The answer is the largest GPU count of any node in the partition (its GRES
    column); a request above it could never start and would wait in the queue
    forever ("Requested node configuration is not available" at best).
    """
    if not spec.gpus_per_node:
        return
    partition = spec.option("partition")
    argv = ["sinfo", "-h", "-o", "%P|%G"] + (["-p", partition] if partition else [])
    try:
        out = runner.run(argv, timeout=20).stdout
    except CommandError:
        return  # no sinfo here, or no cluster config: sbatch will judge
    rows = [line.split("|", 1) for line in out.splitlines() if "|" in line]
    if partition is None:
        rows = [r for r in rows if r[0].endswith("*")] or rows  # the default partition
    else:
        rows = [r for r in rows if r[0].rstrip("*") in partition.split(",")] or rows
    if not rows:
        return
    most = max(gres_gpus(g) for _, g in rows)
    if spec.gpus_per_node > most:
        names = ", ".join(sorted({p.rstrip("*") for p, _ in rows}))
        have = f"at most {most} GPUs per node" if most else "no GPUs"
        raise SpecError(
            f"--gpus-per-node {spec.gpus_per_node}: partition {names} has {have} (from sinfo)",
            "ask for fewer, choose a GPU partition with --partition (`sinfo -o '%P %G'` lists them), "
            "or drop --gpus-per-node for a CPU job",
        )


def node_names(runner: Runner) -> list[str]:
    """The node names Slurm knows (``sinfo -N``); [] when it cannot be asked."""
    try:
        out = runner.run(["sinfo", "-h", "-N", "-o", "%N"], timeout=30).stdout
    except CommandError:
        return []  # cannot ask: sbatch will say it
    return sorted({line.strip() for line in out.splitlines() if line.strip()})
