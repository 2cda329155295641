"""Flight Recorder dumps: whose collective sequence is behind.

torch's Flight Recorder keeps the last N collectives of every rank (``TORCH_FR_BUFFER_SIZE``, legacy
``TORCH_NCCL_TRACE_BUFFER_SIZE``) and, with ``TORCH_NCCL_DUMP_ON_TIMEOUT=1``, writes them when a
collective times out to ``$TORCH_FR_DUMP_TEMP_FILE<rank>`` (legacy ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``)
as a pickled dict: ``version``, ``pg_config``, ``pg_status`` (per process group
``last_enqueued_collective``, ``last_started_collective``, ``last_completed_collective``) and
``entries`` (``collective_seq_id``, ``profiling_name``, ``state``, ``pg_id``, ...).

In a hang, the ranks waiting in a collective have enqueued it; the culprit has not: its
``last_enqueued_collective`` is behind theirs. The dumps are read with a restricted unpickler that
builds only plain containers and scalars (a dump file must never run code). torch ships the full
analyser as ``torch.distributed.flight_recorder`` (``torchfrtrace``): where it imports, its
``match_one_event`` decides whether two ranks' entries of one collective match (op, sizes, dtypes);
without it, the same three fields are compared here.

How dumps get here (boot/sitecustomize.py): every rank keeps ``TORCH_FR_BUFFER_SIZE`` entries
(``--flight-recorder N|off``); the hang watch touches ``<job dir>/fr/request`` (:func:`request`) and
each rank's dump thread writes ``<job dir>/fr/rank-N``, from a thread of its own, so a rank blocked in
a collective answers too. A rank that exits with its process group still up writes ``rank-N.left``.
"""

from __future__ import annotations

import io
import os
import pickle
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Optional

from torchhpc.core.units import plural
from torchhpc.diagnose.groups import chain, descriptions, entry_of, group_name, members, statuses
from torchhpc.jobdir.layout import FR_DIR

__all__ = ["FR_DIR", "Finding", "analyse", "collect", "completed", "load_dumps", "members", "post_mortem", "read_dump",
           "request"]

_SAFE = {("builtins", n) for n in ("dict", "list", "tuple", "set", "frozenset", "str", "bytes", "int", "float",
                                   "bool", "NoneType")}


class _Plain(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _SAFE:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"a Flight Recorder dump holds no {module}.{name}: refused")


def read_dump(data: bytes) -> dict[str, Any]:
    """One rank's dump, built of plain values only (pickle.UnpicklingError otherwise)."""
    out = _Plain(io.BytesIO(data)).load()
    if not isinstance(out, dict):
        raise pickle.UnpicklingError("a Flight Recorder dump is a dict")
    return out


def load_dumps(directory: str, prefix: str = "", suffix: str = "") -> dict[int, dict[str, Any]]:
    """rank -> dump for every ``<prefix><rank><suffix>`` file in ``directory`` that reads."""
    found: dict[int, dict[str, Any]] = {}
    for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
        m = re.fullmatch(re.escape(prefix) + r"(\d+)" + re.escape(suffix), name)
        if not m:
            continue
        try:
            with open(os.path.join(directory, name), "rb") as f:
                found[int(m.group(1))] = read_dump(f.read())
        except (OSError, pickle.UnpicklingError, EOFError, ValueError):
            continue
    return found




def request(job_dir: str) -> float:
    """Ask every rank of the job to dump (touch ``<job dir>/fr/request``); the time asked."""
    d = os.path.join(job_dir, FR_DIR)
    os.makedirs(d, exist_ok=True)
    path, now = os.path.join(d, "request"), time.time()
    with open(path, "a"):
        pass
    os.utime(path, (now, now))
    return now


def collect(job_dir: str, ranks: int, since: float = 0.0, wait: float = 5.0, every: float = 0.25
            ) -> tuple[dict[int, dict[str, Any]], set[int]]:
    """The dumps written after ``since`` (and every ``.left`` one), waiting up to ``wait`` s for ``ranks``
    of them: (rank -> dump, the ranks that left the group with it up)."""
    d = os.path.join(job_dir, FR_DIR)
    deadline = time.monotonic() + wait
    while True:
        fresh = {r for r in range(ranks) if _mtime(os.path.join(d, f"rank-{r}")) >= since}
        left = set(load_dumps(d, "rank-", ".left"))
        if len(fresh | left) >= ranks or time.monotonic() >= deadline:
            break
        time.sleep(every)
    dumps = {r: v for r, v in load_dumps(d, "rank-").items() if r in fresh}
    for r, v in load_dumps(d, "rank-", ".left").items():
        dumps.setdefault(r, v)
    return dumps, left


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return -1.0


@dataclass(frozen=True)
class Finding:
    """One process group's story from the dumps, for the verdict's first line."""

    kind: str  # missed | left | mismatch-op | mismatch-size | stalled | no-dump | in-step
    pg: str  # the group's name in the dumps (one across ranks; "0": the world)
    seq: int  # the collective (sequence number in the group) the story is about
    op: str  # what the waiting ranks called there ("all_reduce")
    culprits: tuple[int, ...]
    waiting: tuple[int, ...]
    waited_s: float = 0.0
    detail: str = ""  # the culprits' own call (mismatch), or why a rank has no dump
    group: str = ""  # a subgroup's members as said ("ranks 2,3"); "" for the world
    then: tuple[Finding, ...] = ()  # the findings this one causes (ranks stuck in it, missing elsewhere)
    desc: str = ""  # a subgroup's description where torch has one (a DeviceMesh dimension: "mesh_tp")

    @property
    def at(self) -> str:
        """The collective, named by its group: "all_reduce #7 (pg 0)", "all_reduce #7 of the group of ranks 2,3 (pg 2)"."""
        return f"{self.op} #{self.seq} " + (f"of the group of {self.group} ({self.pg_id})" if self.group else f"({self.pg_id})")

    @property
    def pg_id(self) -> str:
        """torch's id of the group, with its description where it has one: "pg 4, mesh_tp"."""
        return f"pg {self.pg}" + (f", {self.desc}" if self.desc else "")

    def line(self) -> str:
        """This finding's sentence, then each consequence: who waits, for whom, where."""
        out = self._own()
        for c in self.then:
            them, wait = _ranks(c.waiting), "waits" if len(c.waiting) == 1 else "wait"
            world = "" if c.group else "the world's "
            out += f", so {them} {wait} for {_ranks(c.culprits)} in {world}{c.at}"
        return out

    def _own(self) -> str:
        who, them = _ranks(self.culprits), _ranks(self.waiting)
        have, wait = ("has", "waits") if len(self.waiting) == 1 else ("have", "wait")
        at = self.at
        waited = f" for {self.waited_s:.0f} s" if self.waited_s >= 1 else ""
        if self.kind == "missed":
            return f"{who} never entered {at}; {them} {have} waited in it{waited}"
        if self.kind == "left":
            return f"{who} left the group (exited without destroy_process_group) before {at}; {them} waited in it{waited}"
        if self.kind == "mismatch-op":
            where = f" of the group of {self.group}" if self.group else ""
            return f"collective mismatch at #{self.seq}{where} ({self.pg_id}): {them} called {self.op}, {who} {self.detail}"
        if self.kind == "mismatch-size":
            return f"size mismatch in {at}: {them} passed {self.detail.split('|')[0]}, {who} {self.detail.split('|')[1]}"
        if self.kind == "stalled":
            return f"every rank entered {at} with matching arguments: a stall in the transport, not the program"
        if self.kind == "no-dump" and self.waiting:
            return f"{who} wrote no flight recorder dump ({self.detail}); {them} {wait} in {at}{waited}"
        if self.kind == "no-dump":
            return f"{who} wrote no flight recorder dump ({self.detail})"
        return f"no rank waits in a collective of pg {self.pg} (last: {at}): the ranks are in their own code"


def _ranks(ranks: tuple[int, ...]) -> str:
    """"rank 1", "ranks 0,2-3"; "no rank" rather than an empty list."""
    from torchhpc.jobdir.logs import format_ranks

    return f"{plural(len(ranks), 'rank')} {format_ranks(ranks)}" if ranks else "no rank"


def _op(entry: Mapping[str, Any]) -> str:
    return str(entry.get("profiling_name", "")).partition(":")[2].split(" ")[0] or str(entry.get("profiling_name", "?"))


def _match(a: Mapping[str, Any], b: Mapping[str, Any], group: Optional[frozenset[int]] = None) -> str:
    """"" when two ranks' entries of one collective agree, else "op" or "size".

    With the group's membership known, torch's own matcher decides (it checks an all_gather's output
    against its input times the group's size); entries only recorded at different moments (one
    completed, one still waiting) agree, and so do all_to_all calls of one op (their sizes may differ
    by design). Without torch or the membership, the two calls' sizes and dtypes are compared."""
    if _op(a) != _op(b):
        return "op"
    if _op(a).startswith("all_to_all"):
        return ""
    if group:
        try:  # torch's own analyser (imports torch: only ever asked after a hang)
            from torch.distributed.flight_recorder.components.types import MatchState
            from torch.distributed.flight_recorder.components.utils import match_one_event

            pg = str(a.get("pg_id", "0"))
            state = match_one_event(dict(a), dict(b), {pg: set(group)}, pg).state
            if state == MatchState.COLLECTIVE_TYPE_MISMATCH:
                return "op"
            return "size" if state in (MatchState.SIZE_OR_SYNTAX_MISMATCH, MatchState.COLLECTIVE_DTYPE_MISMATCH) else ""
        except Exception:  # no torch here, or a format it does not know: compare the fields ourselves
            pass
    same = all(a.get(k) == b.get(k) for k in ("input_sizes", "output_sizes", "input_dtypes", "output_dtypes"))
    return "" if same else "size"


def _late(dumps: Mapping[int, Mapping[str, Any]], pg: str, top: int, op: str, late: tuple[int, ...],
          ahead: tuple[int, ...], left: set[int], waited: float, group: Optional[frozenset[int]]) -> list[Finding]:
    """The ranks behind: left the group, still in an earlier collective whose call differs from the
    others' (the others finished theirs: e.g. a larger tensor waits for data that never comes), or missed."""
    out = []
    gone = tuple(r for r in late if r in left)
    if gone:
        out.append(Finding("left", pg, top, op, gone, ahead, waited))
    missed = []
    for r in (r for r in late if r not in gone):
        mine = statuses(dumps[r]).get(pg, -1)
        e, ref = entry_of(dumps[r], pg, mine), entry_of(dumps[ahead[0]], pg, mine)
        kind = _match(ref, e, group) if e and ref else ""
        if kind == "op":
            out.append(Finding("mismatch-op", pg, mine, _op(ref), (r,), ahead, waited, _op(e)))
        elif kind:
            out.append(Finding("mismatch-size", pg, mine, _op(ref), (r,), ahead, waited,
                               f"{ref.get('input_sizes')}|passed {e.get('input_sizes')}"))
        else:
            missed.append(r)
    if missed:
        out.append(Finding("missed", pg, top, op, tuple(missed), ahead, waited))
    return out


def completed(job_dir: str) -> bool:
    """The job's own end marker says it completed (exit 0): its dumps then tell no failure's story."""
    from torchhpc.jobdir.endmark import read_end

    mark = read_end(job_dir)
    return mark is not None and mark.state == "COMPLETED" and mark.exit_code in (0, None)


def post_mortem(job_dir: str, done: bool = False) -> list[Finding]:
    """A finished job's story from whatever its ranks dumped (``.left`` at exit, or on request).

    None for a job that completed (``done``, or its end marker says so): ranks that end without
    destroy_process_group() leave dumps at every exit, and a job that succeeded has no culprit."""
    if done or completed(job_dir):
        return []
    d = os.path.join(job_dir, FR_DIR)
    left = load_dumps(d, "rank-", ".left")
    dumps = {**load_dumps(d, "rank-"), **left}  # the exit dump is the newer one
    if not dumps:
        return []
    world = max([max(dumps) + 1, *(pg_size(v) for v in dumps.values())])
    return [f for f in analyse(dumps, world, set(left)) if f.kind != "in-step"]


def pg_size(dump: Mapping[str, Any]) -> int:
    """The default group's size from a dump's ``pg_config`` (its ``ranks`` is a printed list)."""
    conf = dump.get("pg_config")
    groups = conf.values() if isinstance(conf, Mapping) else ()
    return max((len(re.findall(r"\d+", str(g.get("ranks", "")))) for g in groups if isinstance(g, Mapping)), default=0)


_NO_DUMP = "its process is gone, is stopped, or never started a process group"


def analyse(dumps: Mapping[int, Mapping[str, Any]], world: int, left: set[int] = frozenset(),  # type: ignore[assignment]
            now: float | None = None) -> list[Finding]:
    """Per process group: who never entered the collective the others wait in, who left the group,
    or whose call differs from the others' at the same sequence number. ``now``: for how long the
    others have waited (None: a finished job, no wait figure). Each group's membership is the dumps'
    own (:func:`members`), a group's collective is counted among its members only, and a rank missing
    from one group's collective because it waits in another's is that other finding's consequence
    (:func:`~torchhpc.diagnose.groups.chain`): the root cause comes first."""
    out: list[Finding] = []
    missing = tuple(r for r in range(world) if r not in dumps)
    groups: dict[str, dict[int, int]] = {}
    for rank, d in dumps.items():
        for pg, last in statuses(d).items():
            groups.setdefault(pg, {})[rank] = last
    of = members(dumps, world)
    for pg, group in of.items():  # a member that never enqueued a collective in it has no status yet: at 0
        for rank in dumps:
            if group is not None and rank in group and (pg in groups or pg == "0"):
                groups.setdefault(pg, {}).setdefault(rank, 0)
    for pg, seq in sorted(groups.items()):
        group = of.get(pg)
        top = max(seq.values())
        ahead = tuple(sorted(r for r, s in seq.items() if s == top))
        late = tuple(sorted(r for r, s in seq.items() if s < top))
        ref = entry_of(dumps[ahead[0]], pg, top)
        op = _op(ref) if ref else "collective"
        created = [float(e.get("time_created_ns") or 0) / 1e9 for r in ahead if (e := entry_of(dumps[r], pg, top))]
        waited = max(0.0, now - min(created)) if created and now is not None else 0.0
        if late:
            out += _late(dumps, pg, top, op, late, ahead, left, waited, group)
            continue
        entries = {r: entry_of(dumps[r], pg, top) for r in ahead}
        kinds = {r: _match(ref, e, group) if e else "" for r, e in entries.items()}
        odd = tuple(r for r, k in kinds.items() if k)
        if odd and len(odd) * 2 > len(ahead):  # the reference was the odd one out: take the majority's view
            ref = entries[odd[0]]
            kinds = {r: _match(ref, e, group) if e else "" for r, e in entries.items()}
            odd = tuple(r for r, k in kinds.items() if k)
        others = tuple(r for r in ahead if r not in odd)
        if odd and others:  # no majority (every call differs from every other) names no one
            e = entries[odd[0]]
            if kinds[odd[0]] == "op":
                out.append(Finding("mismatch-op", pg, top, _op(ref), odd, others, waited, _op(e)))
            else:
                sizes = f"{ref.get('input_sizes')}|passed {e.get('input_sizes')}"
                out.append(Finding("mismatch-size", pg, top, _op(ref), odd, others, waited, sizes))
        elif ref and not ref.get("retired") and str(ref.get("state")) != "completed":
            if missing:  # the others wait for someone: the rank that could not answer
                out.append(Finding("no-dump", pg, top, op, missing, ahead, waited, _NO_DUMP))
                missing = ()
            else:
                out.append(Finding("stalled", pg, top, op, (), ahead, waited))
        else:
            out.append(Finding("in-step", pg, top, op, (), ahead))
    if missing:
        out.append(Finding("no-dump", "0", 0, "", missing, (), 0.0, _NO_DUMP))
    said = descriptions(dumps)
    return chain([replace(f, group=group_name(f.pg, of.get(f.pg), world), desc=said.get(f.pg, "") if f.pg != "0" else "")
                  for f in out], dumps)
