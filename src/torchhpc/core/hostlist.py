"""Slurm hostlists and PBS nodefiles.

Slurm writes node sets compactly (``gpu[01-04,07]``, ``a[1-2]-b[3-4]``); every
rank must agree on the first host to use it as MASTER_ADDR, so we expand them
fully and in Slurm's order instead of guessing with a regex.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable

from torchhpc.errors import SpecError

__all__ = ["compress", "expand", "first_host", "ranges", "read_nodefile"]


def _split_top(text: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    out: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise SpecError(f"hostlist {text!r} has an unmatched ']'")
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth:
        raise SpecError(f"hostlist {text!r} has an unmatched '['")
    out.append("".join(cur))
    return [p.strip() for p in out if p.strip()]


def _expand_range(body: str, whole: str) -> list[str]:
    items: list[str] = []
    for part in body.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise SpecError(f"hostlist {whole!r}: bad range {part!r}", "write ranges like [1-4,7]")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        width = len(lo) if lo.startswith("0") or len(lo) == len(hi) else 0
        if int(hi) < int(lo):
            raise SpecError(f"hostlist {whole!r}: range {part!r} runs backwards")
        items.extend(str(i).zfill(width) for i in range(int(lo), int(hi) + 1))
    return items


def _expand_one(pattern: str) -> list[str]:
    pieces: list[list[str]] = []
    pos = 0
    for m in re.finditer(r"\[([^\]]*)\]", pattern):
        pieces.append([pattern[pos : m.start()]])
        pieces.append(_expand_range(m.group(1), pattern))
        pos = m.end()
    pieces.append([pattern[pos:]])
    return ["".join(combo) for combo in itertools.product(*pieces)]


def expand(hostlist: str) -> list[str]:
    """``node[1-3,7],gpu[01-02]`` -> ``[node1, node2, node3, node7, gpu01, gpu02]``."""
    return [host for group in _split_top(hostlist.strip()) for host in _expand_one(group)]


def first_host(hostlist: str) -> str:
    hosts = expand(hostlist)
    if not hosts:
        raise SpecError(f"hostlist {hostlist!r} is empty")
    return hosts[0]


def ranges(numbers: Iterable[int], width: int = 0) -> str:
    """Sorted distinct numbers as Slurm writes them: ``[0, 1, 2, 8]`` -> ``0-2,8`` (each ``width`` digits, zero-padded)."""
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ",".join(str(a).zfill(width) + ("" if a == b else f"-{str(b).zfill(width)}") for a, b in runs)


def compress(hosts: Iterable[str]) -> str:
    """The inverse of :func:`expand` for hosts sharing a prefix and a trailing number.

    Zero padding is a property of the whole range, as in Slurm: ``gpu0999`` and
    ``gpu1000`` are both four-digit names of ``gpu[0001-1024]``, so a number
    without a leading zero joins the padded range of its prefix when it has
    that range's width.
    """
    parsed: list[tuple[str, str]] = []
    plain: list[str] = []
    padded: dict[str, set[int]] = {}  # prefix -> widths seen with a leading zero
    for h in hosts:
        m = re.fullmatch(r"(.*?)(\d+)", h)
        if not m:
            plain.append(h)
            continue
        prefix, digits = m.group(1), m.group(2)
        parsed.append((prefix, digits))
        if len(digits) > 1 and digits.startswith("0"):
            padded.setdefault(prefix, set()).add(len(digits))
    groups: dict[tuple[str, int], set[int]] = {}
    for prefix, digits in parsed:
        width = len(digits) if len(digits) in padded.get(prefix, ()) else 0
        groups.setdefault((prefix, width), set()).add(int(digits))
    out = list(dict.fromkeys(plain))
    for (prefix, width), numbers in groups.items():
        nums = sorted(numbers)
        if len(nums) == 1:
            out.append(f"{prefix}{str(nums[0]).zfill(width)}")
            continue
        out.append(f"{prefix}[{ranges(nums, width)}]")
    return ",".join(out)


def read_nodefile(text: str) -> list[str]:
    """Hosts of a PBS nodefile (one line per slot), deduplicated, order kept."""
    hosts = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    return list(dict.fromkeys(hosts))
