"""The partition's side of why a Slurm job is pending (:mod:`~torchhpc.schedulers.slurm.pending`).

Apart from pending.py, which names the calls and reads Slurm's reason: here are the rows of the partition's
nodes (``sinfo``) and queue (``squeue``), and what they say about this job: whether the partition can ever
run it (more nodes than it has, a feature no node has, the partition down), which of its nodes fit the job,
which have room for it now (a partly used node, from ``scontrol show node``), and the tally ``status`` shows.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Optional

from torchhpc.core.hostlist import compress, expand
from torchhpc.core.units import counted

__all__ = [
    "SINFO_FORMAT",
    "SQUEUE_FORMAT",
    "UNSET",
    "NodeRow",
    "QueueRow",
    "amount",
    "free_nodes",
    "int_of",
    "never_evidence",
    "node_tally",
    "parse_nodes",
    "parse_queue",
]

# The fields torchhpc asks of sinfo and squeue (pending.queries), read back by parse_nodes and parse_queue.
SINFO_FORMAT = "%P|%a|%l|%D|%N|%T|%c|%m|%f|%E"
SQUEUE_FORMAT = "%i|%T|%Q|%D|%C|%u|%q|%j|%N|%e|%r"
# How Slurm writes a field that has no value.
UNSET = ("", "(null)", "None", "N/A", "Unknown")


@dataclass(frozen=True)
class NodeRow:
    """One node of the partition, as ``sinfo -N -o SINFO_FORMAT`` lists it."""

    partition: str
    avail: str  # the partition's state: up, down, drain, inact
    node: str
    state: str  # idle, mixed, allocated, drained, down*, ...
    cpus: int
    memory_mb: int
    features: tuple[str, ...]
    reason: str  # why a node is drained or down


@dataclass(frozen=True)
class QueueRow:
    """One job of the queue, as ``squeue -o SQUEUE_FORMAT`` lists it."""

    job_id: str
    state: str
    priority: int
    nodes: int
    cpus: int
    user: str
    qos: str
    name: str
    nodelist: str
    end: str
    reason: str


def int_of(text: str) -> int:
    """The leading digits of a field as a number (``4(x)``, ``2-4``, ``16000M``); 0 where there are none."""
    m = re.match(r"\d+", text.strip())
    return int(m.group()) if m else 0


def parse_nodes(text: str) -> list[NodeRow]:
    """The rows of ``sinfo -h -N -o SINFO_FORMAT`` (a line of fewer fields is skipped)."""
    rows = []
    for line in text.splitlines():
        p = line.split("|", 9)
        if len(p) < 10:
            continue
        feats = tuple(f for f in p[8].split(",") if f and f not in UNSET)
        rows.append(NodeRow(p[0].rstrip("*"), p[1], p[4], p[5], int_of(p[6]), int_of(p[7]), feats,
                            "" if p[9] in ("none", *UNSET) else p[9]))
    return rows


def parse_queue(text: str) -> list[QueueRow]:
    """The rows of ``squeue -h -o SQUEUE_FORMAT`` (a line of other fields is skipped)."""
    return [QueueRow(p[0], p[1], int_of(p[2]), int_of(p[3]), int_of(p[4]), p[5], p[6], p[7], p[8], p[9], p[10])
            for line in text.splitlines() if len(p := line.split("|", 10)) == 11]


def amount(item: str) -> float:
    """``cpu=4`` -> 4, ``mem=23593M`` -> 23593 (MiB), ``mem=2G`` -> 2048."""
    m = re.search(r"=(\d+(?:\.\d+)?)([KMGT]?)", item)
    if not m:
        return 0.0
    return float(m.group(1)) * {"": 1, "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 ** 2}[m.group(2)]


def _requested_features(expr: str) -> Optional[list[str]]:
    """Features a plain ``a&b`` / ``a,b`` constraint needs (None: an expression too rich to check here)."""
    if not expr or expr in UNSET:
        return []
    if re.search(r"[|\[\]*()!]", expr):
        return None
    return [f for f in re.split(r"[&,]", expr) if f]


def never_evidence(job: Mapping[str, str], nodes: Sequence[NodeRow], asked: int) -> list[str]:
    """Evidence that the partition can never run the request as it stands (empty: none found)."""
    if not nodes:
        return []
    part = nodes[0].partition
    names = {n.node for n in nodes}
    why = []
    if nodes[0].avail not in ("up",):
        why.append(f"partition {part} is {nodes[0].avail.upper()}")
    if asked > len(names):
        why.append(f"it asks {asked} nodes; partition {part} has {len(names)}")
    feats = _requested_features(job.get("Features", ""))
    if feats:
        have = {f for n in nodes for f in n.features}
        missing = [f for f in feats if f not in have]
        if missing:
            why.append(f"no node in {part} has feature {', '.join(missing)} (features there: "
                       f"{', '.join(sorted(have)) or 'none'})")
    return why


def _fit(nodes: Sequence[NodeRow], job: Mapping[str, str]) -> list[NodeRow]:
    """The partition's nodes that have the job's features and CPUs per node."""
    feats = _requested_features(job.get("Features", "")) or []
    cpus = int_of(job.get("MinCPUsNode", "1"))
    return [n for n in nodes if all(f in n.features for f in feats) and n.cpus >= cpus]


def _room(use: str, job: Mapping[str, str]) -> set[str]:
    """The nodes of ``scontrol show node -o`` with the CPUs and memory one node of the job needs free.

    CPUs per node: MinCPUsNode, or the job's CPUs over its nodes. Memory only where the job asks some
    (MinMemoryNode, MinMemoryCPU x CPUs): without it (MinMemoryNode=0) Slurm does not count memory.
    """
    nodes = max(1, int_of(job.get("NumNodes", "1")))
    cpus = max(int_of(job.get("MinCPUsNode", "1")), -(-int_of(job.get("NumCPUs", "1")) // nodes))
    mem = amount("=" + job.get("MinMemoryNode", "0")) or amount("=" + job.get("MinMemoryCPU", "0")) * cpus
    out = set()
    for line in use.splitlines():
        f = dict(re.findall(r"(?:^|\s)(\w+)=(\S*)", line))
        total = int_of(f.get("CPUEfctv", "") or f.get("CPUTot", "0"))
        if "NodeName" in f and total - int_of(f.get("CPUAlloc", "0")) >= cpus and (
                not mem or int_of(f.get("RealMemory", "0")) - int_of(f.get("AllocMem", "0")) >= mem):
            out.add(f["NodeName"])
    return out


def _state(n: NodeRow, room: set[str]) -> str:
    """idle, mixed (partly used, with room for the job), allocated (no room), drained, down, ..."""
    s = n.state.rstrip("*~#!%$@^-").lower()
    if s == "mixed" and n.node in room:
        return "mixed"
    return ("idle" if s == "idle" else "allocated" if s in ("allocated", "mixed", "completing")
            else "drained" if s.startswith("drain") else "down" if s.startswith("down") else s)


def free_nodes(nodes: Sequence[NodeRow], job: Mapping[str, str], use: str) -> int:
    """The nodes that could take one node of the job now: idle, or mixed with room for it."""
    room = _room(use, job)
    return sum(1 for n in _fit(nodes, job) if _state(n, room) in ("idle", "mixed"))


def node_tally(nodes: Sequence[NodeRow], job: Mapping[str, str], queue: Sequence[QueueRow], use: str = "") -> list[str]:
    """The nodes that could fit the request, by state, and what the busy ones are doing."""
    fit = _fit(nodes, job)
    room = _room(use, job)
    by: dict[str, list[str]] = {}
    for n in fit:
        by.setdefault(_state(n, room), []).append(n.node)
    part = nodes[0].partition if nodes else job.get("Partition", "?")
    shown = ("idle", "mixed", "allocated", "drained", "down")
    counts = ", ".join(f"{len(by.get(k, []))} {'partly used with room for it' if k == 'mixed' else k}"
                       for k in shown if k != "mixed" or by.get(k))
    extra = "".join(f", {len(v)} {k}" for k, v in by.items() if k not in shown)
    asked = job.get("NumNodes", "?")
    lo, _, hi = asked.partition("-")
    asked = lo if hi in ("", lo) else asked
    cpus = job.get("NumCPUs", "?")
    out = [f"nodes in {part} that fit it: {counts}{extra} (of {len(fit)}); it asks {asked} "
           f"node{'' if asked == '1' else 's'}, {cpus} CPU{'' if cpus == '1' else 's'}"]
    running = [q for q in queue if q.state in ("RUNNING", "COMPLETING")]
    for q in running[:6]:
        on = [h for h in expand(q.nodelist) if h in by.get("allocated", []) + by.get("mixed", [])] if q.nodelist else []
        if on:
            end = f", until {q.end}" if q.end not in UNSET else ""
            out.append(f"  {compress(on)}: job {q.job_id} ({q.name}, {q.user}, {counted(q.nodes, 'node')}{end})")
    out += [f"  {n.node}: {n.state}" + (f" ({n.reason})" if n.reason else "")
            for n in fit if n.node in by.get("drained", []) + by.get("down", [])]
    return out
