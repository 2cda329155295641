"""Refusing at submit what could never run on this Slurm cluster, from what sinfo, sacctmgr and squeue say.

sbatch accepts a job that asks for more nodes than its partition has, more memory than any node's
``RealMemory``, more CPUs per node than a node has, or ``--exclude`` of all but one node: it waits in the
queue forever (``PartitionNodeLimit``, ``Resources``), and ``wait`` prints a line a second for it. A
command not on PATH (``-- nosuchcmd``) ran on the nodes to exit 127 under torchhpc's own task shim. A
partition or account that does not exist fails inside torchhpc's held submit, whose sbatch line says
nothing to the user; an ``--after-ok`` id Slurm does not know is dropped, and the job starts at once.
Each is refused here instead: exit 2 (:class:`~torchhpc.errors.SpecError`), one ``Error:`` line naming
the value and a ``HINT:`` naming what is there. A question that cannot be asked (no sinfo, no
accounting) passes: sbatch judges, as before. GPUs per node: slurm/nodes.py (``check_gpus``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass

from torchhpc.core.hostlist import expand
from torchhpc.core.proc import Runner
from torchhpc.core.spec import JobSpec
from torchhpc.core.units import format_bytes, parse_size
from torchhpc.errors import CommandError, SpecError
from torchhpc.launchers import launcher_of
from torchhpc.schedulers.slurm.site import SINFO_ARGV

__all__ = ["Node", "check_account", "check_command", "check_dependencies", "check_fits", "nodes_of"]


@dataclass(frozen=True)
class Node:
    name: str
    partition: str
    default: bool
    cpus: int
    memory_mb: int


def nodes_of(text: str) -> list[Node]:
    """``SINFO_ARGV``'s rows (slurm/site.py: one per node and partition)."""
    out = []
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 4 or not parts[2].isdigit():
            continue
        mem = parts[3].rstrip("+")
        out.append(Node(parts[0], parts[1].rstrip("*"), parts[1].endswith("*"), int(parts[2]),
                        int(mem) if mem.isdigit() else 0))
    return out


def _ask(runner: Runner, argv: list[str]) -> str | None:
    try:
        return runner.run(argv, timeout=20).stdout
    except CommandError:
        return None  # cannot ask here: sbatch judges


def check_fits(spec: JobSpec, runner: Runner) -> None:
    """Refuse a job its partition can never run: the partition itself, nodes, memory, CPUs per node, exclusions."""
    text = _ask(runner, list(SINFO_ARGV))
    nodes = nodes_of(text or "")
    if not nodes:
        return
    partitions = sorted({n.partition for n in nodes})
    asked = spec.option("partition")
    if asked:
        unknown = [p for p in asked.split(",") if p not in partitions]
        if unknown:
            raise SpecError(f"--partition {asked}: this cluster has no partition {', '.join(unknown)} (from sinfo)",
                            f"partitions here: {', '.join(partitions)} (--partition NAME)")
        mine = [n for n in nodes if n.partition in asked.split(",")]
    else:
        mine = [n for n in nodes if n.default] or nodes
    where = f"partition {asked or mine[0].partition}"
    launcher = launcher_of(spec)
    cpus = (launcher.tasks_per_node(spec) or 1) * (launcher.cpus_per_task(spec) or 1)
    most_cpus = max(n.cpus for n in mine)
    if cpus > most_cpus:
        raise SpecError(
            f"{launcher.tasks_per_node(spec)} tasks x {launcher.cpus_per_task(spec) or 1} CPUs per node: {where}'s "
            f"nodes have at most {most_cpus} CPUs (from sinfo)",
            f"ask for at most {most_cpus} CPUs per node (fewer --nproc-per-node or --cpus-per-task), or another partition")
    if spec.mem:
        want = parse_size(spec.mem, "--mem")
        most_mb = max(n.memory_mb for n in mine)
        if most_mb and want > most_mb * 1024 * 1024:
            raise SpecError(f"--mem {spec.mem}: {where}'s nodes have at most {format_bytes(most_mb * 1024 * 1024)} "
                            "(RealMemory, from sinfo)", f"ask for at most --mem {most_mb}M, or leave --mem out")
    excluded = set(expand(spec.option("exclude") or ""))
    names = sorted({n.name for n in mine if n.name not in excluded and n.cpus >= cpus})
    needed = spec.nodes + spec.spares
    if needed > len(names):
        cut = f" once --exclude {spec.option('exclude')} is taken out" if excluded else ""
        fit = " with the CPUs asked" if len(names) < len({n.name for n in mine} - excluded) else ""
        asked_for = f"--nodes {spec.nodes}" + (f" + --spares {spec.spares}" if spec.spares else "")
        raise SpecError(
            f"{asked_for}: {where} has {len(names)} node{'' if len(names) == 1 else 's'}{fit}{cut} (from sinfo)",
            f"nodes there: {', '.join(names) or 'none'}; ask for at most {len(names)}, or another partition")


def check_account(spec: JobSpec, runner: Runner) -> None:
    """Refuse an ``--opt account=`` the accounting does not list for this user (sacctmgr; skipped without it)."""
    account = spec.option("account") or os.environ.get("SBATCH_ACCOUNT")
    if not account:
        return
    text = _ask(runner, ["sacctmgr", "-n", "-P", "show", "associations", "format=account,user"])
    if text is None:
        return
    user = os.environ.get("USER") or os.environ.get("LOGNAME") or ""
    rows = [line.split("|") for line in text.splitlines() if "|" in line]
    accounts = sorted({a for a, u in rows if a and (not user or u in (user, ""))})
    if accounts and account not in accounts:
        raise SpecError(f"--account {account}: not an account of yours on this cluster (from sacctmgr)",
                        f"accounts here: {', '.join(accounts)} (--account NAME)")


def check_dependencies(spec: JobSpec, runner: Runner, known: Sequence[str] | None = None) -> None:
    """Refuse an ``--after-*`` id Slurm does not know: it would drop the dependency and start the job at once.
    ``known``: the ids squeue and sacct answered for (asked here when None)."""
    ids = [d.job_id for d in spec.after if not d.job_id.startswith("<")]
    if not ids:
        return
    if known is None:
        queue = _ask(runner, ["squeue", "-h", "-o", "%i", "-j", ",".join(ids)])
        done = _ask(runner, ["sacct", "-n", "-X", "-P", "-o", "JobID", "-j", ",".join(ids)])
        if queue is None and done is None:
            return
        known = [*(queue or "").split(), *(done or "").split()]
    found = {k.split("_")[0] for k in known} | set(known)
    missing = [d for d in spec.after if d.job_id not in found and d.job_id.split("_")[0] not in found]
    if missing:
        d = missing[0]
        raise SpecError(f"{d.flag} {d.job_id}: Slurm knows no job {d.job_id} (squeue and sacct); it would drop the "
                        "dependency and start this job at once",
                        "give the id `torchhpc run` printed (`torchhpc list -s slurm` lists yours)")


def check_command(spec: JobSpec) -> None:
    """Refuse a command (``-- nosuchcmd``) on no PATH: sbatch exports this PATH to the job, so the nodes would not
    find it either. Left to the job where the nodes may have more: a container, the profile's setup lines
    (``module load``), an absolute path (a node-local disk)."""
    entry = spec.entrypoint
    if entry.kind != "command" or spec.container is not None or spec.setup or os.path.isabs(entry.target):
        return
    if shutil.which(entry.target) is None:
        raise SpecError(f"the command {entry.target!r} is not on PATH here, and the job's nodes get this PATH "
                        "(sbatch exports it)", "give its full path, a script.py, or a profile whose setup lines "
                        "provide it (module load ...)")
