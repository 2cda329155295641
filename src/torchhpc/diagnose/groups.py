"""Process groups as the Flight Recorder dumps show them: who belongs to each, and which hang causes which.

A job's collectives run in several groups: the world, and the subgroups a program makes with
``new_group`` or a DeviceMesh (FSDP2's HSDP, tensor and pipeline parallel groups, a metrics group).
Three facts of the dumps decide how they are read (torch 2.13, seen in real gloo dumps):

* an entry's ``pg_id`` and the ``pg_status`` keys are the rank's *own* numbering (both pairs of a
  ``{0,1},{2,3}`` job call their group 1); the group's name, one across ranks, is the entry's
  ``process_group[0]`` ("1" for ``{0,1}``, "2" for ``{2,3}``). Groups are keyed here by that name.
* NCCL writes each group's ranks in ``pg_config`` (keyed by name); gloo writes ``{'': {'ranks': '[]'}}``,
  so there a group's members are the ranks whose entries name it (a member that never called a
  collective in it is not seen: the dumps cannot show it).
* a rank that "never entered" a collective may be blocked in another group's collective: the
  chain (:func:`chain`) follows it to the rank missing there, the root cause.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Optional

__all__ = ["chain", "departs", "descriptions", "entry_of", "group_name", "members", "name_of", "statuses"]


def name_of(entry: Mapping[str, Any]) -> str:
    """The group an entry belongs to, by its name (one across ranks); its pg id where it names none."""
    group = entry.get("process_group")
    if isinstance(group, (tuple, list)) and group and str(group[0]) != "":
        return str(group[0])
    return str(entry.get("pg_id"))


def _local_names(dump: Mapping[str, Any]) -> dict[str, str]:
    """This rank's pg id -> group name, from its entries."""
    entries = dump.get("entries", ())
    return {str(e["pg_id"]): name_of(e) for e in entries if isinstance(e, Mapping) and e.get("pg_id") is not None}


def descriptions(dumps: Mapping[int, Mapping[str, Any]]) -> dict[str, str]:
    """Group name -> the description torch gave it, where it says more than torch's defaults (a DeviceMesh
    dimension's group is "mesh_tp"; ``new_group`` says "undefined", the world "default_pg")."""
    out: dict[str, str] = {}
    for d in dumps.values():
        for e in d.get("entries", ()):
            group = e.get("process_group") if isinstance(e, Mapping) else None
            if isinstance(group, (tuple, list)) and len(group) > 1 and str(group[1]) not in ("", "undefined", "default_pg"):
                out[name_of(e)] = str(group[1])
    return out


def statuses(dump: Mapping[str, Any]) -> dict[str, int]:
    """Group name -> the last collective this rank enqueued in it (``pg_status``, keyed by its own pg ids)."""
    names = _local_names(dump)
    return {names.get(str(pg), str(pg)): int(st.get("last_enqueued_collective", -1))
            for pg, st in (dump.get("pg_status") or {}).items() if isinstance(st, Mapping)}


def entry_of(dump: Mapping[str, Any], group: str, seq: int) -> Mapping[str, Any]:
    """This rank's entry of collective ``seq`` in ``group`` (the last one recorded), or {}."""
    found: Mapping[str, Any] = {}
    for e in dump.get("entries", ()):
        if (isinstance(e, Mapping) and e.get("collective_seq_id") == seq and not e.get("is_p2p")
                and name_of(e) == group):
            found = e
    return found


def members(dumps: Mapping[int, Mapping[str, Any]], world: int) -> dict[str, Optional[frozenset[int]]]:
    """Group name -> its global ranks: as ``pg_config`` states them (NCCL), else the ranks whose entries or
    status name the group (gloo, whose ``pg_config`` names none). The default group "0" is the world."""
    stated: dict[str, frozenset[int]] = {}
    for d in dumps.values():
        conf = d.get("pg_config")
        for key, g in (conf.items() if isinstance(conf, Mapping) else ()):
            name = str(g.get("name") or key) if isinstance(g, Mapping) else ""
            ranks = frozenset(int(x) for x in re.findall(r"\d+", str(g.get("ranks", "")))) if name else frozenset()
            if ranks:
                stated[name] = stated.get(name, frozenset()) | ranks
    seen: dict[str, set[int]] = {}
    for rank, d in dumps.items():
        for name in {*statuses(d), *_local_names(d).values()}:
            seen.setdefault(name, set()).add(rank)
    out: dict[str, Optional[frozenset[int]]] = {}
    for name, named_by in seen.items():
        out[name] = stated.get(name) or (frozenset(range(world)) if name == "0" else frozenset(named_by))
    out["0"] = stated.get("0") or frozenset(range(world))
    return out


def group_name(pg: str, group: Optional[frozenset[int]], world: int) -> str:
    """How a verdict names a subgroup, by its members ("ranks 2,3"): "" for the world (torch's id says it)."""
    if not group or pg == "0" or len(group) >= world:
        return ""
    from torchhpc.jobdir.logs import format_ranks

    return f"ranks {','.join(map(str, sorted(group))) if len(group) <= 8 else format_ranks(group)}"


_STUCK_IN = ("missed", "left", "mismatch-op", "mismatch-size", "stalled", "no-dump")


def departs(dumps: Mapping[int, Mapping[str, Any]], rank: int) -> Optional[int]:
    """Where ``rank``'s calls first leave the order the majority of ranks called theirs in (the record id of
    that call, counted from 0 on every rank), or None. An SPMD program calls the same sequence on every rank, each in its
    own groups: position by position, a call is its group's number *on that rank* (a rank's first subgroup
    is its pg 1, whichever pair it is in) and its sequence number there. A rank that skipped a collective
    departs where it skipped; a rank that only waits does not depart."""
    from collections import Counter

    def calls(d: Mapping[str, Any]) -> dict[int, tuple[str, int]]:  # by record id: a full ring buffer drops the oldest
        return {int(e.get("record_id") or 0): (str(e.get("pg_id")), int(e.get("collective_seq_id") or 0))
                for e in d.get("entries", ()) if isinstance(e, Mapping) and not e.get("is_p2p")}

    seqs = {r: calls(d) for r, d in dumps.items()}
    mine = seqs.get(rank, {})
    for i in sorted(mine):
        there = Counter(s[i] for s in seqs.values() if i in s)
        common, n = there.most_common(1)[0]
        if n * 2 > sum(there.values()) and mine[i] != common:
            return i
    return None


def chain(findings: Sequence[Any], dumps: Mapping[int, Mapping[str, Any]] = {}) -> list[Any]:
    """The findings with each consequence folded into its root cause (``then``), roots first.

    A "missed" finding is a consequence when every rank it names is itself stuck in another finding's
    collective: waiting in it, or inside it with a call that differs. Its root is followed to the end.
    Two findings can each name a rank that waits in the other's collective (rank 3 skipped the pair's
    all_reduce and waits in the world's, where its partner never arrives): of such a cycle, the root is
    the finding whose rank left the program's common order first (:func:`departs`); with no such
    rank, all of them stay roots (nothing says which came first)."""
    from dataclasses import replace

    def stuck_in(rank: int, not_this: int) -> Optional[int]:
        for i, g in enumerate(findings):
            if i != not_this and g.kind in _STUCK_IN and (
                    rank in g.waiting or (g.kind.startswith("mismatch") and rank in g.culprits)):
                return i
        return None

    parent: dict[int, int] = {}
    for i, f in enumerate(findings):
        if f.kind != "missed" or not f.culprits:
            continue
        where = [stuck_in(r, i) for r in f.culprits]
        if all(w is not None for w in where):
            parent[i] = int(where[0])  # type: ignore[arg-type]
    for i in list(parent):  # break each cycle at the finding whose rank departed first
        path = [i]
        while path[-1] in parent and parent[path[-1]] not in path:
            path.append(parent[path[-1]])
        if path[-1] not in parent:
            continue
        cycle = path[path.index(parent[path[-1]]):]
        when = {j: min((d for r in findings[j].culprits if (d := departs(dumps, r)) is not None), default=-1)
                for j in cycle}
        known = [j for j in cycle if when[j] >= 0]
        for j in [min(known, key=lambda j: when[j])] if known else cycle:
            parent.pop(j, None)

    def root(i: int) -> int:
        while i in parent:
            i = parent[i]
        return i

    roots: dict[int, list[int]] = {}
    for i in range(len(findings)):
        r = root(i)
        roots.setdefault(r, [])
        if r != i:
            roots[r].append(i)
    ordered = sorted(roots, key=lambda i: (-len(roots[i]), i))
    return [replace(findings[i], then=tuple(findings[j] for j in roots[i])) if roots[i] else findings[i]
            for i in ordered]
