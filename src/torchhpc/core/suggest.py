"""Did-you-mean: the closest known names to a mistyped one, by edit distance (as git and cargo do).

Stdlib only, so every layer can use it: the CLI for flags and subcommands, the scheduler
registry for the ``slurm`` of a job handle, the option tables for ``--opt`` keys.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["closest", "did_you_mean", "edit_distance"]


def edit_distance(a: str, b: str) -> int:
    """Insertions, deletions, substitutions and swaps of two neighbours (``nodse`` -> ``nodes`` is 1)."""
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        cur = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = 0 if a[i - 1] == b[j - 1] else 1
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                cur[j] = min(cur[j], prev2[j - 2] + 1)
        prev2, prev = prev, cur
    return prev[-1]


def closest(word: str, known: Iterable[str], limit: int = 3) -> list[str]:
    """The known names nearest to ``word``, best first; none when nothing is near.

    Near: at most a third of the word's letters changed (at least 1, at most 3), compared without
    leading dashes and case (``-nodes`` and ``--NODES`` find ``--nodes``). A name that starts with
    ``word`` (3 letters or more: ``--gpu`` for ``--gpus-per-node``) is near too.
    """
    bare = word.lstrip("-").lower()
    if not bare:
        return []
    allowed = min(3, max(1, len(bare) // 3))
    scored: list[tuple[int, str]] = []
    for name in dict.fromkeys(known):
        other = name.lstrip("-").lower()
        d = edit_distance(bare, other)
        if d <= allowed or (len(bare) >= 3 and other.startswith(bare)):
            scored.append((d, name))
    scored.sort(key=lambda t: t[0])
    return [name for _d, name in scored[:limit]]


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """``"did you mean --nodes?"`` (or ``"did you mean a or b?"``), or ``""`` when nothing is near."""
    near = closest(word, known)
    return f"did you mean {' or '.join(near)}?" if near else ""
