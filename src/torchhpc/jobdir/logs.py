"""A job's log, line by line, each line attributed to one rank.

Where lines come from:

* **per-rank files** (``ranks/rank-N@NODE.log`` in the job directory), written
  by each rank's own process through :data:`LOG_WRAPPER`. One writer per file,
  so every line is whole and belongs to exactly one rank, whatever the launcher
  does with its pipes. Measured on the dev cluster (64 ranks printing 200 lines
  each): mpirun ``--tag-output`` splices ranks mid-line (0 of 64 ranks intact),
  torchrun ``--tee`` splices them too (python ``-u`` writes a line in pieces and
  torchrun's tail prints each piece), srun ``--label`` keeps lines whole only up
  to 1024 bytes (longer ones come back in labelled pieces), and OpenMPI's
  ``--output-filename`` loses the last output of ranks killed on abort.
* **the scheduler's output** (``slurm.out``): torchhpc's own lines, Slurm's and
  the launchers' messages, and, for logs written before per-rank files, rank
  lines behind a launcher prefix, parsed by :func:`parse_line`:
  srun ``--label`` (``12: ``), torchrun (``3: [rank13]: `` or ``3: [default1]:``),
  mpirun ``--tag-output`` (``[1,12]<stdout>:``) and the local scheduler (``[rank12]: ``).

Nothing here talks to a scheduler: the CLI (``torchhpc logs``) finds the files
through the job's record and hands them to :class:`JobLog`. What the attributed lines
say, each failing rank's first traceback, is read in :mod:`torchhpc.jobdir.tracebacks`.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Optional

from torchhpc.core.hostlist import ranges
from torchhpc.jobdir.layout import RANKS_DIR
from torchhpc.jobdir.log_wiring import job_dir
from torchhpc.jobdir.record import JobRecord, load_record, read_record
from torchhpc.launchers import LAUNCHERS

__all__ = [
    "MAX_RANKS",
    "TASK_END",
    "TASK_END_LINE",
    "JobLog",
    "Line",
    "filter_rank",
    "format_ranks",
    "job_log",
    "last_writes",
    "log_text",
    "parse_line",
    "parse_ranks",
    "rank_files",
    "select",
    "task_record",
    "task_text",
]


@dataclass(frozen=True)
class Line:
    """One line of a job's log: the rank that wrote it (None: the job itself), its node, its text."""

    rank: Optional[int]
    text: str
    node: str = ""
    task: Optional[int] = None  # the array task of a log that holds every task's lines (``[task I] ``)

    def show(self) -> str:
        """The line as ``torchhpc logs`` prints it: ``[rankN]: text`` (job lines unprefixed; a line torch
        already prefixed with its rank, as it does a failing rank's traceback, is not prefixed twice), behind
        its ``[task I] `` where the log is an array's."""
        task = f"[task {self.task}] " if self.task is not None else ""
        if self.rank is None or self.text.startswith(f"[rank{self.rank}]:"):
            return task + self.text
        return f"{task}[rank{self.rank}]: {self.text}"

    @property
    def own(self) -> str:
        """The text as the rank's program wrote it: without the ``[rankN]: `` torch puts before every line of
        a traceback raised after ``init_process_group`` (the rank's own N only; other text is kept)."""
        if self.rank is not None and self.text.startswith(f"[rank{self.rank}]: "):
            return self.text[len(f"[rank{self.rank}]: "):]
        return self.text


_RANK_FILE = re.compile(r"^rank-(\d+)(?:@(.*))?\.log$")
_LOCAL = re.compile(r"^\[rank(\d+)\]: ")
# the local scheduler's array: every task's lines in one log, each behind its task (schedulers/local/array.py)
TASK_PREFIX = re.compile(r"^\[task (\d+)\] ")
# ... and each task's own end, the last of its lines, with its reason where it failed (``: rank 1 exited with
# code 3``): what `sweep status` and `diagnose` read back of each task
TASK_END = "torchhpc: task {index} ended {state}, exit {code}, after {s:.1f} s{reason}"
TASK_END_LINE = re.compile(r"^torchhpc: task (\d+) ended (\w+), exit (-?\d+), after ([\d.]+) s(?:: (.*))?$")


def parse_line(line: str, launcher: str = "srun", nproc_per_node: int = 1) -> Line:
    """Who wrote ``line`` of a scheduler output file: the launcher's own tag parser
    (:mod:`torchhpc.launchers.tags`), else the local scheduler's ``[rankN]: ``, each read behind a local
    array's ``[task I] ``. ``launcher`` is a record's: a launcher's name, or ``local``."""
    line = line.rstrip("\r\n")
    t = TASK_PREFIX.match(line)
    if t:
        inner = parse_line(line[t.end():], launcher, nproc_per_node)
        return Line(inner.rank, inner.text, inner.node, int(t.group(1)))
    parse = LAUNCHERS[launcher].parse_tag if launcher in LAUNCHERS else None
    tag = parse(line, nproc_per_node) if parse else None
    if tag is not None:
        found = Line(*tag)
        # slurmstepd's own words (CANCELLED ... DUE TO TIME LIMIT) come through task 0's stream behind its label
        return Line(None, found.text) if found.text.startswith("slurmstepd") else found
    m = _LOCAL.match(line)
    return Line(int(m.group(1)), line[m.end():]) if m else Line(None, line)


def filter_rank(text: str, rank: int, launcher: str, nproc_per_node: int) -> str:
    """Keep one rank's lines, whole, from a scheduler output file (the launcher's tag says whose)."""
    lines = text.splitlines(keepends=True)
    return "".join(line for line in lines if parse_line(line, launcher, nproc_per_node).rank == rank)


# The most ranks a rank list may name: far more than any job has, far less than fills memory.
MAX_RANKS = 1_000_000


def parse_ranks(spec: str) -> list[int]:
    """``3``, ``3,7`` or ``0-3,8`` -> sorted ranks. ValueError on anything else.

    A range that ends before it starts (``3-1``) and lists of more than
    :data:`MAX_RANKS` ranks are refused, before any range is expanded.
    """
    out: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"{part or spec!r} is not a rank or a range of ranks")
        first = int(lo)
        last = int(hi) if sep else first
        if last < first:
            raise ValueError(f"the range {part!r} ends before it starts")
        if last - first + 1 > MAX_RANKS:
            raise ValueError(f"the range {part!r} spans {last - first + 1} ranks, more than {MAX_RANKS}")
        out.update(range(first, last + 1))
        if len(out) > MAX_RANKS:
            raise ValueError(f"{spec!r} names more than {MAX_RANKS} ranks")
    return sorted(out)


def format_ranks(ranks: Iterable[int]) -> str:
    """The inverse of :func:`parse_ranks`: ``[0, 1, 2, 8]`` -> ``0-2,8``."""
    return ranges(sorted(set(ranks)))


def rank_files(ranks_dir: str) -> dict[int, tuple[str, str]]:
    """``{rank: (path, node)}`` of the per-rank files in ``ranks_dir`` (empty if there is none)."""
    try:
        names = os.listdir(ranks_dir)
    except OSError:
        return {}
    found = {int(m.group(1)): (os.path.join(ranks_dir, name), m.group(2) or "")
             for name in names if (m := _RANK_FILE.match(name))}
    return dict(sorted(found.items()))


def last_writes(ranks_dir: str) -> dict[int, tuple[float, str]]:
    """rank -> (when its file was last written, its node): the rank's last output line, or its death."""
    out: dict[int, tuple[float, str]] = {}
    for rank, (path, node) in rank_files(ranks_dir).items():
        with contextlib.suppress(OSError):  # the file went away meanwhile
            out[rank] = (os.stat(path).st_mtime, node)
    return out


class _Tail:
    """Complete lines appended to one file since the last read (a partial line waits)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""

    def read(self, final: bool = False) -> list[str]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            data = b""
        self.offset += len(data)
        data = self.partial + data
        lines = data.split(b"\n")
        self.partial = lines.pop()
        if final and self.partial:
            lines.append(self.partial)
            self.partial = b""
        return [raw.decode("utf-8", "replace").rstrip("\r") for raw in lines]


@dataclass
class JobLog:
    """A job's log files: the scheduler's output and (if any) the per-rank files.

    :meth:`read` returns the new complete lines since the last call, so one
    object serves both ``logs`` (one read) and ``logs -f`` (read until the job
    ends, then ``read(final=True)`` for a last line without its newline).
    """

    output: Optional[str] = None
    ranks_dir: Optional[str] = None
    launcher: str = "srun"
    nproc_per_node: int = 1
    _tails: dict[str, _Tail] = field(default_factory=dict, repr=False)

    def _read(self, path: str, final: bool) -> list[str]:
        if path not in self._tails:
            self._tails[path] = _Tail(path)
        return self._tails[path].read(final)

    def read(self, final: bool = False) -> list[Line]:
        """New lines: the scheduler output's first, then each rank's in rank order."""
        out: list[Line] = []
        if self.output:
            out = [parse_line(text, self.launcher, self.nproc_per_node) for text in self._read(self.output, final)]
        ranks = rank_files(self.ranks_dir) if self.ranks_dir else {}
        for rank, (path, node) in ranks.items():
            out.extend(Line(rank, text, node) for text in self._read(path, final))
        return out

    def failure_order(self) -> dict[int, float]:
        """When each rank's file was last written: a rank that died wrote its traceback last."""
        return {r: t for r, (t, _node) in last_writes(self.ranks_dir).items()} if self.ranks_dir else {}

    def nodes(self) -> dict[int, str]:
        return {r: n for r, (_p, n) in rank_files(self.ranks_dir).items()} if self.ranks_dir else {}


def select(
    lines: Iterable[Line],
    ranks: Optional[Sequence[int]] = None,
    nodes: Optional[Sequence[str]] = None,
    node_of: Optional[dict[int, str]] = None,
    grep: Optional[re.Pattern[str]] = None,
) -> list[Line]:
    """The lines of these ranks / on these nodes / matching ``grep`` (each filter optional)."""
    want = set(ranks) if ranks is not None else None
    on = set(nodes) if nodes is not None else None
    node_of = node_of or {}
    out = []
    for ln in lines:
        if want is not None and ln.rank not in want:
            continue
        if on is not None and (ln.rank is None or (ln.node or node_of.get(ln.rank, "")) not in on):
            continue
        if grep is not None and not grep.search(ln.text):
            continue
        out.append(ln)
    return out


def job_log(scheduler: str, job_id: str, output: Optional[str] = None) -> Optional[JobLog]:
    """The log files of a job torchhpc submitted, from its record (None: no file is known).

    ``output`` is the scheduler's output file when the caller knows it better
    (e.g. from ``scontrol``); the record's ``job_dir`` holds ``ranks/``.
    """
    rec = task_record(scheduler, job_id)
    out = rec.output_path or output
    if not out and not rec.job_dir:
        return None
    return JobLog(
        output=out or None,
        ranks_dir=os.path.join(rec.job_dir, RANKS_DIR) if rec.job_dir else None,
        launcher=rec.launcher or "srun",
        nproc_per_node=rec.nproc_per_node,
    )


def task_record(scheduler: str, job_id: str) -> JobRecord:
    """The record of a job, or of one array task ``ARRAY_TASK``: its array's record, with the
    task's own directory (``<output-dir>/<name>-ARRAY_TASK``, made by the task's batch shell);
    an empty record when there is neither."""
    rec = load_record(scheduler, job_id)
    array_id, _, task = job_id.partition("_")
    if rec is not None or not task:
        return rec or read_record(scheduler, job_id)
    rec = read_record(scheduler, array_id)
    if rec.array and rec.script:
        script = rec.script
        home = os.path.dirname(script)
        if os.path.basename(home) == f"{rec.name}-{array_id}":
            # the script is kept in the array's own directory; the tasks' are its siblings
            script = os.path.join(os.path.dirname(home), rec.name + os.path.splitext(script)[1])
        rec = rec.with_(job_dir=job_dir(script, job_id))
    return rec


def log_text(log: JobLog, rank: Optional[int] = None) -> str:
    """The whole log as ``torchhpc logs`` prints it, or one rank's lines as it wrote them."""
    lines = log.read(final=True)
    if rank is None:
        return "".join(ln.show() + "\n" for ln in lines)
    return "".join(ln.text + "\n" for ln in lines if ln.rank == rank)


def task_text(text: str, task: Optional[int], rank: Optional[int] = None) -> str:
    """One task's lines of a log that holds every task's (a local array's), as that task printed them
    (``[rankN]: `` kept); with ``rank``, that rank's lines as it wrote them. ``task`` None: every line."""
    out = []
    for raw in text.splitlines():
        ln = parse_line(raw, "local")
        if task is not None and ln.task != task:
            continue
        if rank is None:
            out.append(Line(ln.rank, ln.text).show() if task is not None else raw)
        elif ln.rank == rank:  # every task's rank N, each behind its task, where no task was named
            out.append(ln.text if task is not None or ln.task is None else f"[task {ln.task}] {ln.text}")
    return "".join(x + "\n" for x in out)
