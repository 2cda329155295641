"""Job arrays: Slurm's ``--array`` syntax, parsed once, rendered for every scheduler.

``0-15`` (16 tasks), ``1,3,7``, ``0-31:2`` (every second), ``0-31%4`` (at most 4 at
once). Inside every task torchhpc exports ``TORCHHPC_ARRAY_INDEX`` (this task's index)
and ``TORCHHPC_ARRAY_COUNT`` (how many tasks), and replaces ``{index}`` (and a sweep's
``{NAME}``) in the program's arguments at run time, in the task itself.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Optional

from torchhpc.core import hostlist
from torchhpc.errors import SpecError

__all__ = ["MAX_TASKS", "ArraySpec", "check_placeholders", "last_result", "parse_array", "refuse_array", "substitute"]

MAX_TASKS = 10000
_HINT = "write Slurm's array syntax: 0-15, 1,3,7, 0-31:2 or 0-31%4 (at most 4 at once)"
_RANGE = r"(\d+)(?:-(\d+)(?::(\d+))?)?"  # re compiles (and caches) it on use: --array only


@dataclass(frozen=True)
class ArraySpec:
    """The task indices of an array job and how many may run at once (``None``: no cap)."""

    indices: tuple[int, ...]
    parallel: Optional[int] = None

    @property
    def count(self) -> int:
        return len(self.indices)

    def ranges(self) -> str:
        """The indices as Slurm/Torque write them: ``0-3,7`` (consecutive runs collapsed)."""
        return hostlist.ranges(self.indices)

    def slurm(self) -> str:
        """``#SBATCH --array`` (and Torque ``-t``) value."""
        return self.ranges() + (f"%{self.parallel}" if self.parallel else "")

    def pbs_pro(self) -> str:
        """PBS Pro ``-J X-Y[:Z][%N]``: one range with a step, at least two indices."""
        idx = self.indices
        step = idx[1] - idx[0] if len(idx) > 1 else 1
        if len(idx) < 2 or any(b - a != step for a, b in zip(idx, idx[1:])):
            raise SpecError(
                f"PBS Pro arrays (-J) take one range X-Y[:STEP] of at least two indices, not {self.slurm()!r}",
                "give --array as a range such as 0-7 or 0-14:2, or use --opt select_style=torque (Torque's -t takes lists)",
            )
        text = f"{idx[0]}-{idx[-1]}" + (f":{step}" if step != 1 else "")
        return text + (f"%{self.parallel}" if self.parallel else "")


def parse_array(text: str, field: str = "--array") -> ArraySpec:
    """``"0-31%4"`` -> indices 0..31, at most 4 at once. Bad input: :class:`SpecError` with a hint."""
    value = str(text).strip()
    body, sep, cap = value.partition("%")
    parallel: Optional[int] = None
    if sep:
        if not cap.isdigit() or int(cap) < 1:
            raise SpecError(f"{field} {value!r}: the limit after % must be a positive number", _HINT)
        parallel = int(cap)
    if not body:
        raise SpecError(f"{field} {value!r} names no task index", _HINT)
    seen: set[int] = set()
    for part in body.split(","):
        m = re.fullmatch(_RANGE, part.strip())
        if not m:
            raise SpecError(f"{field} {value!r}: {part!r} is not INDEX, FIRST-LAST or FIRST-LAST:STEP", _HINT)
        first = int(m.group(1))
        last = int(m.group(2)) if m.group(2) is not None else first
        step = int(m.group(3)) if m.group(3) is not None else 1
        if last < first:
            raise SpecError(f"{field} {value!r}: the range {part!r} ends before it starts", _HINT)
        if step < 1:
            raise SpecError(f"{field} {value!r}: the step in {part!r} must be at least 1", _HINT)
        if (last - first) // step + 1 + len(seen) > MAX_TASKS:
            raise SpecError(f"{field} {value!r} has more than {MAX_TASKS} tasks", "split the sweep into several arrays")
        seen.update(range(first, last + 1, step))
    return ArraySpec(tuple(sorted(seen)), parallel)


def substitute(args: tuple[str, ...] | list[str], values: dict[str, str]) -> list[str]:
    """``{NAME}`` -> ``values[NAME]`` in every argument (plain text replacement, nothing else is read)."""
    out = []
    for arg in args:
        for name, val in values.items():
            arg = arg.replace("{" + name + "}", val)
        out.append(arg)
    return out


_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def check_placeholders(args: tuple[str, ...] | list[str], names: list[str]) -> None:
    """Refuse a ``{NAME}`` in an array task's arguments that no task defines (``{idx}``, a grid name not given).

    Left alone, it would reach every task unreplaced: N identical tasks after a queue wait.
    """
    for arg in args:
        for m in _PLACEHOLDER.finditer(arg):
            if m.group(1) not in names:
                defined = ", ".join("{" + n + "}" for n in names)
                raise SpecError(
                    f"program argument {arg[:80]!r}: {{{m.group(1)}}} is not a placeholder of this array "
                    f"(defined: {defined})",
                    f"write one of {defined}, or add --grid {m.group(1)}=V1,V2 to a sweep; "
                    "braces meant for the program itself go in a file or an --env value",
                )


def refuse_array(scheduler: str, array: Optional[str]) -> None:
    """Schedulers without job arrays (Kubernetes, RunAI) say so instead of running one task."""
    if array is not None:
        raise SpecError(
            f"the {scheduler} scheduler has no job arrays (--array {array})",
            "submit one job per task (torchhpc run with -e TORCHHPC_ARRAY_INDEX=I in a loop), or use slurm, pbs or local",
        )


_RESULT = r"RESULT (\{.*\})\s*$"  # re compiles (and caches) it on use


def last_result(text: str) -> Optional[dict[str, Any]]:
    """The last ``RESULT {json}`` line of a log (any prefix: ``0: ``, ``[rank0]: ``), parsed."""
    for line in reversed(text.splitlines()):
        m = re.search(_RESULT, line)
        if m:
            try:
                value = json.loads(m.group(1))
            except ValueError:
                continue
            return value if isinstance(value, dict) else None
    return None
