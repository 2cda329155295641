"""What the ranks' stacks say about a hang: who waits in a collective, who is the culprit, what the Flight Recorder adds.

The hang watch (:mod:`torchhpc.diagnose.hang`) decides when to look and what to do;
this module judges what it saw: a stack's frames in, a :class:`HangVerdict` and its
lines for the user out (only :func:`with_flight` touches files: it asks the ranks for their dumps). Kept
apart because more than the watch reads stacks this way: ``torchhpc top``'s sampler
(observe/sample.py) names the collective a rank waits in, and the failure verdict
(diagnose/verdict.py, diagnose/readback.py) the user's frame, with the same rules.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace

from torchhpc.core.units import plural
from torchhpc.diagnose.probe import RankStack

__all__ = ["HangVerdict", "collective", "culprit", "exiting", "in_collective", "render", "starting", "user_frame", "why_unread", "with_flight"]

# torch.distributed calls a rank waits in while a peer is late (the py-spy frame names)
_COLLECTIVES = re.compile(
    r"^(all_reduce|all_gather\w*|reduce_scatter\w*|broadcast\w*|barrier|reduce|gather\w*|scatter\w*|"
    r"all_to_all\w*|send|recv|isend|irecv|wait|monitored_barrier|_store_based_barrier|rendezvous|"
    r"init_process_group)$"
)

# Where a rank that finished its work waits while it exits: torch's teardown (destroy_process_group, also
# torchhpc's guard of it), the interpreter joining threads at exit, torchhpc's exit cures (boot/sitecustomize.py)
_EXITING = {"destroy_process_group": "", "_shutdown": "threading.py", "gloo_workers_settle": "sitecustomize.py",
            "_left_group": "sitecustomize.py", "flight_dump": "sitecustomize.py"}


def exiting(frames: Sequence[tuple[str, str, int]]) -> bool:
    """Whether a stack is a rank's exit in progress (its teardown, or the interpreter's own at exit)."""
    return any(fn in _EXITING and path.endswith(_EXITING[fn]) for fn, path, _ln in frames)


def starting(frames: Sequence[tuple[str, str, int]]) -> bool:
    """Whether a stack is a rank still starting: importing, or a warm client (boot/warm.py) whose standby has
    not forked its rank yet. At load 30 a standby importing torch kept four clients quiet and idle for over
    the hang timeout; the watch named one of them hung, in socket.py (CI of stop 74)."""
    return any("<frozen importlib" in path or (fn == "client" and path.endswith("warm.py")) for fn, path, _ln in frames)


def collective(frames: Sequence[tuple[str, str, int]]) -> str:
    """The torch.distributed call a stack waits in (a peer is late), or "" when it is in the user's own code."""
    return next((fn for fn, path, _ln in frames if _COLLECTIVES.match(fn) and "torch/distributed" in path), "")


def in_collective(frames: Sequence[tuple[str, str, int]]) -> bool:
    return bool(collective(frames))


def user_frame(frames: Sequence[tuple[str, str, int]]) -> str:
    """The innermost frame outside installed packages: where the user's code is, file:line."""
    from torchhpc.diagnose.classify import user_file

    return next((f"{path}:{line}" for _fn, path, line in frames
                 if user_file(path) and not path.startswith("torch/")), "")


@dataclass(frozen=True)
class HangVerdict:
    culprits: tuple[int, ...]
    waiting: tuple[int, ...]
    stacks: tuple[RankStack, ...] = field(default=())
    note: str = ""
    flight: tuple[str, ...] = ()  # the Flight Recorder's story, one line per process group (first: the hang's name)
    flight_culprits: tuple[int, ...] = ()  # the ranks its first line names
    flight_kind: str = ""  # its kind (diagnose.flight.Finding): missed, left, mismatch-op, mismatch-size, ...
    at_exit: tuple[str, ...] = ()  # every rank's program had ended: who hung in its exit, and where (no hang)

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def why_unread(stacks: Sequence[RankStack]) -> str:
    """Why no stack was read, by reason: "py-spy timed out after 30 s (the node is loaded)" when every rank
    says the same, else each reason with its ranks. Never a bare list of pids."""
    from torchhpc.jobdir.logs import format_ranks

    by: dict[str, list[int]] = {}
    for s in stacks:
        by.setdefault(s.error or "no stack could be read", []).append(s.rank)
    if len(by) <= 1:
        return next(iter(by), "no rank process was found")
    return "; ".join(f"{plural(len(r), 'rank')} {format_ranks(r)}: {why}" for why, r in by.items())


def culprit(stacks: Sequence[RankStack]) -> HangVerdict:
    """The ranks whose stack is outside a collective while others wait in one. None is named without that
    evidence: not when no stack was read (the note says why), not when no rank waits in a collective
    (every rank quiet in its own code alike; a job's only rank is its hang), and not a rank whose stack
    could not be read."""
    waiting = tuple(s.rank for s in stacks if s.frames and in_collective(s.frames))
    others = tuple(s.rank for s in stacks if s.frames and s.rank not in waiting)
    note = ""
    if not any(s.frames for s in stacks):
        note = f"stacks not read: {why_unread(stacks)}"
    elif not others:
        note = "every rank waits in a collective: look for a mismatched collective (order or size) or a network stall"
    elif not waiting and len(others) > 1:  # one rank alone is the hang; of several alike, none stands out
        inside = any("torch" in str(f[1]) for s in stacks for f in s.frames)
        note = ("no Python stack is in a torch.distributed call (a collective DDP runs from C++ in backward does "
                "not show there): none stands out as the culprit") if inside else \
            "no rank is inside torch: each waits in its own code alike, and none stands out as the culprit"
        others = ()
    return HangVerdict(others, waiting, tuple(stacks), note)


def with_flight(v: HangVerdict, job_dir: str, wait: float = 5.0) -> HangVerdict:
    """``v`` with the Flight Recorder's story: every rank is asked to dump (up to ``wait`` s; a rank
    that does not answer is named). Nothing is added when no rank dumped at all (recorder off)."""
    from torchhpc.diagnose import flight

    if not job_dir or not os.path.isdir(job_dir):
        return v
    since = flight.request(job_dir) - 0.5
    dumps, left = flight.collect(job_dir, len(v.stacks), since, wait)
    if not dumps:
        return v
    world = max([len(v.stacks), *(flight.pg_size(d) for d in dumps.values())])
    if world > len(dumps):  # a rank the probe did not see (it exited) may still have left a dump
        dumps, left = flight.collect(job_dir, world, since, 1.0)
    by_rank = {s.rank: s for s in v.stacks}
    findings = flight.analyse(dumps, world, left, time.time())
    if any(f.kind != "in-step" for f in findings):  # a group in step beside a hang is no story of its own
        findings = [f for f in findings if f.kind != "in-step"]
    lines = []
    for f in findings:
        line = f.line()
        # the stacks, where read, corroborate: where the named ranks are now (the root's, and the rank it holds up)
        for r in dict.fromkeys((*f.culprits[:2], *(f.then[0].culprits[:1] if f.then else ()))):
            s = by_rank.get(r)
            if s is not None and s.frames:
                call = collective(s.frames)
                line += (f"; rank {r}'s stack: {call} at {user_frame(s.frames) or s.frames[0][1]}" if call else
                         f"; rank {r} is in {user_frame(s.frames) or s.frames[0][1]} ({s.frames[0][0]})")
        lines.append(line)
    named = findings[0].culprits if findings else ()
    # the dumps saw which collective each rank reached: a note from the stacks alone no longer stands
    return replace(v, flight=tuple(lines), flight_culprits=named, flight_kind=findings[0].kind if findings else "",
                   note="" if named and v.note and not v.note.startswith("stacks not read") else v.note)


def render(v: HangVerdict, quiet_s: float) -> list[str]:
    """The hang's lines for the user: culprit, its host and file:line, what the others do."""
    from torchhpc.jobdir.logs import format_ranks

    by_rank = {s.rank: s for s in v.stacks}
    lines = [f"torchhpc: hang: no rank printed for {quiet_s:.0f}s and no rank used CPU"]
    lines += [f"torchhpc: hang: {line}" for line in v.flight]
    for r in v.culprits[:4]:
        s = by_rank[r]
        where = user_frame(s.frames)
        top = s.frames[0][0] if s.frames else ""
        lines.append(f"torchhpc: hang: rank {r} on {s.host} is not in a collective" + (f": {top} at {where}" if where else ""))
        lines += [f"    {fn} ({path}:{ln})" for fn, path, ln in s.frames[:6]]
    if v.waiting:
        calls = sorted({collective(by_rank[r].frames) for r in v.waiting})
        who = f"rank {v.waiting[0]} waits" if len(v.waiting) == 1 else f"ranks {format_ranks(v.waiting)} wait"
        lines.append(f"torchhpc: hang: {who} in " + ", ".join(calls))
    if v.note:
        lines.append(f"torchhpc: hang: {v.note}")
    return lines
