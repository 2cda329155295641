"""Each failing rank's first traceback, read back from a job's log lines (``torchhpc logs --errors``).

Apart from :mod:`torchhpc.jobdir.logs`, which says who wrote each line: this reads what a rank's lines
say once they are attributed. A rank's lines may hold stdout merged in between a traceback's frames
(one file, two streams), a chained traceback, torch's ``[rankN]: `` before each line, or Python's
report of a file it could not compile, which has no ``Traceback`` header at all; ``diagnose/classify.py``
reads that report with :func:`compile_error_end` too.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

from torchhpc.jobdir.logs import Line

__all__ = ["SYNTAX_FILE", "Tracebacks", "compile_error_end", "first_tracebacks"]

_TB_START = "Traceback (most recent call last):"
# Python's report of a file it could not compile has no "Traceback" header: the file and line, the
# source line, a caret, then the error (python x.py with a SyntaxError in x.py)
SYNTAX_FILE = re.compile(r'^\s*File "([^"]+)", line (\d+)\s*$')
SYNTAX_ERROR = re.compile(r"^(?:SyntaxError|IndentationError|TabError)(?::|$)")
# A traceback's last line: "ValueError: bad", "KeyboardInterrupt"; not stdout's "index 0", merged in between
_EXC_LINE = re.compile(r"^[A-Za-z_][\w.]*(?::.*)?$")
_TB_CHAIN = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)


@dataclass(frozen=True)
class Tracebacks:
    """Each failing rank's first traceback, the rank that failed first first (per task, in an array's log)."""

    by_rank: tuple[tuple[int, tuple[str, ...]], ...]
    tasks: tuple[Optional[int], ...] = ()  # the task of each entry of by_rank (empty: no task)

    def __bool__(self) -> bool:
        return bool(self.by_rank)

    def render(self) -> str:
        parts = []
        for i, (rank, block) in enumerate(self.by_rank):
            task = self.tasks[i] if i < len(self.tasks) else None
            who = f"task {task} rank {rank}" if task is not None else f"rank {rank}"
            head = f"=== {who}" + (" (failed first)" if i == 0 and len(self.by_rank) > 1 else "") + " ==="
            parts.append("\n".join([head, *block]))
        return "\n\n".join(parts) + ("\n" if parts else "")


def compile_error_end(texts: Sequence[str], start: int) -> int:
    """The index of the SyntaxError line that ends the compile report starting at ``start`` (-1: none)."""
    if not SYNTAX_FILE.match(texts[start]):
        return -1
    for i in range(start + 1, min(start + 5, len(texts))):
        if SYNTAX_ERROR.match(texts[i].strip()):
            return i
        if not texts[i].startswith((" ", "\t")):
            return -1
    return -1


def _first_traceback(texts: Sequence[str]) -> tuple[int, tuple[str, ...]] | None:
    """(index of its first line, its lines) of the first traceback in one rank's lines (a SyntaxError's report too)."""
    for start, text in enumerate(texts):
        end = compile_error_end(texts, start)
        if end >= 0:
            return start, tuple(texts[start : end + 1])
        if text.strip() != _TB_START:
            continue
        indent = len(text) - len(text.lstrip())
        block, other = [text], 0
        i = start + 1
        while i < len(texts):
            t = texts[i]
            body = t[indent:] if t[:indent].strip() == "" else t
            i += 1
            if body.startswith((" ", "\t")) or body.strip() == _TB_START:
                block.append(t)
                continue
            if not _EXC_LINE.match(body.strip()) and other < 20:  # stdout's line, merged in at load: skipped
                other += 1
                continue
            block.append(t)
            # the exception line; a chained traceback may follow after a blank line
            j = i
            while j < len(texts) and not texts[j].strip():
                j += 1
            if j < len(texts) and texts[j].strip() in _TB_CHAIN:
                j += 1
                while j < len(texts) and not texts[j].strip():
                    j += 1
                if j < len(texts) and texts[j].strip() == _TB_START:
                    block.extend(texts[i : j + 1])
                    i = j + 1
                    continue
            break
        return start, tuple(block)
    return None


def first_tracebacks(lines: Sequence[Line], failed_at: Optional[dict[int, float]] = None) -> Tracebacks:
    """The first traceback of every rank that printed one (of every task's ranks, in an array's log), read
    through torch's own ``[rankN]: `` prefix.

    Order: by ``failed_at`` (per rank, e.g. when its log file was last written)
    when given, else by where the traceback starts in ``lines`` (a combined log
    is in time order).
    """
    per_rank: dict[tuple[Optional[int], int], list[str]] = {}
    position: dict[tuple[Optional[int], int], list[int]] = {}
    for pos, ln in enumerate(lines):
        if ln.rank is not None:
            per_rank.setdefault((ln.task, ln.rank), []).append(ln.own)
            position.setdefault((ln.task, ln.rank), []).append(pos)
    found: list[tuple[tuple[int, float], tuple[Optional[int], int], tuple[str, ...]]] = []
    for who, texts in per_rank.items():
        tb = _first_traceback(texts)
        if tb is None:
            continue
        start, block = tb
        rank = who[1]
        key = (0, failed_at[rank]) if failed_at and rank in failed_at and who[0] is None \
            else (1, float(position[who][start]))
        found.append((key, who, block))
    found.sort(key=lambda f: f[0])
    tasks = tuple(who[0] for _k, who, _b in found)
    return Tracebacks(tuple((who[1], block) for _k, who, block in found),
                      tasks if any(t is not None for t in tasks) else ())
