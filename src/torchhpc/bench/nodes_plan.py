"""The plan and the verdict of ``torchhpc bench nodes``: which pairs run when, and who is slow.

Pure (stdlib only): the worker (:mod:`torchhpc.bench.nodes`) measures, this
module decides, so every decision is unit-tested without a cluster.

The pairwise stage costs O(N) pairs, not the N(N-1)/2 of all pairs:

1. **Ring**: node i with node i+1 (N pairs). Pairs that share no node run at
   the same time, so the ring takes 2 rounds (3 when N is odd).
2. **Confirmation** (the bisection of a slow pair): a node whose every ring
   pair is slow is a *suspect*; its slow pairs are split into their two ends by
   pairing the suspect with a *known-good* node (one with a passing pair) it
   has not met yet. One round holds as many suspects as there are good nodes;
   at most ceil(log2 N) rounds are spent, so a broken half of a cluster still
   costs O(log N) rounds, not O(N). Confirmation rounds carry a reference pair too.
3. **Re-measure** (after the confirmation): a slow ring pair between two good nodes (a possible slow
   *link*), and each suspect still slow with its best good partner (:func:`remeasure_pairs`), run
   again beside a *reference pair* of two other good nodes, and are compared with it: same
   moment, same load (a busy machine slows a healthy pair; a bad link is slow every time). No
   node is named on one busy moment.

A node's pairwise figure is its best pair: a slow link slows every pair it is
in, so a node with one fast pair has a good link. A slow pair between two good
nodes is reported as a slow *link*.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass

from torchhpc.core.units import counted
from torchhpc.errors import UsageError

__all__ = [
    "MIN_ROUND_SECONDS",
    "PREFIX",
    "STARTUP_SECONDS",
    "Pair",
    "Row",
    "check_budget",
    "confirm_rounds",
    "estimate_seconds",
    "exclude_text",
    "format_table",
    "max_confirm_rounds",
    "node_rows",
    "pair_key",
    "pair_scores",
    "plan_counts",
    "reference_pair",
    "remeasure_pairs",
    "retry_rounds",
    "ring_pairs",
    "rounds_of",
    "suspects",
    "verdict",
]

Pair = tuple[str, str]
PREFIX = "bench-nodes: "  # marks the worker's progress lines in the job log
PASS, SLOW, FAIL, NA = "PASS", "SLOW", "FAIL", "n/a"

# The budget model (seconds): starting the ranks (import torch, rendezvous,
# groups), the per-node checks, and a floor per pair round (group set-up,
# warm-up, timed calls). Deliberately low: a budget under it cannot work.
STARTUP_SECONDS = 20.0
NODE_CHECK_SECONDS = 2.0
MIN_ROUND_SECONDS = 3.0


def pair_key(pair: Pair) -> str:
    return f"{pair[0]}-{pair[1]}"


def ring_pairs(nodes: Sequence[str]) -> list[Pair]:
    """Node i with node i+1, closing the ring; 2 nodes make one pair, 1 node none."""
    n = len(nodes)
    if n < 2:
        return []
    if n == 2:
        return [(nodes[0], nodes[1])]
    return [(nodes[i], nodes[(i + 1) % n]) for i in range(n)]


def rounds_of(pairs: Iterable[Pair]) -> list[list[Pair]]:
    """Greedy: each pair goes to the first round where neither of its nodes is busy (ring: 2 or 3 rounds)."""
    rounds: list[list[Pair]] = []
    busy: list[set[str]] = []
    for a, b in pairs:
        for i, used in enumerate(busy):
            if a not in used and b not in used:
                rounds[i].append((a, b))
                used.update((a, b))
                break
        else:
            rounds.append([(a, b)])
            busy.append({a, b})
    return rounds


def max_confirm_rounds(n: int) -> int:
    return max(1, math.ceil(math.log2(n))) if n > 2 else 0


def verdict(value: float | None, median: float | None, slow_ratio: float) -> tuple[float | None, str]:
    """Ratio to the median and PASS / SLOW / FAIL (no figure) / n/a (nothing to compare with)."""
    if value is None:
        return None, FAIL
    if not median:
        return None, NA
    ratio = value / median
    return ratio, (SLOW if ratio < slow_ratio else PASS)


def _median(values: Iterable[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.median(got) if got else None


def pair_scores(measurements: Iterable[Mapping[str, object]], ring: Sequence[Pair]) -> tuple[
        dict[Pair, tuple[float | None, float | None]], float | None]:
    """Each pair's best (ratio, busbw) over its measurements, and the reference busbw.

    A measurement taken beside a reference pair (``ref``: that pair's busbw in the
    same round) is compared with it: the same moment, the same load. Others are
    compared with the median node's best ring pair. A pair whose every
    measurement failed scores (None, None): FAIL.
    """
    ms = [m for m in measurements if m.get("stage") != "reference"]

    def key(m: Mapping[str, object]) -> Pair:
        pair = list(m["pair"])  # type: ignore[call-overload]
        return (str(pair[0]), str(pair[1]))

    best_ring: dict[Pair, float] = {}
    for m in ms:
        v = m.get("busbw")
        if m.get("stage") == "ring" and isinstance(v, (int, float)):
            best_ring[key(m)] = max(best_ring.get(key(m), 0.0), float(v))
    # The reference is the median *node*, each node counted by its best ring pair: with a few
    # nodes a slow node spoils half the ring pairs (2 of 4), and a median of pairs would sit
    # between the slow and the healthy ones; a median of nodes stays with the healthy ones.
    nodes = sorted({x for p in ring for x in p})
    median = _median(max((best_ring[p] for p in ring if x in p and p in best_ring), default=None)
                     for x in nodes)
    scores: dict[Pair, tuple[float | None, float | None]] = {}
    for m in ms:
        p, v, ref = key(m), m.get("busbw"), m.get("ref")
        scores.setdefault(p, (None, None))
        if not isinstance(v, (int, float)):
            continue
        base = float(ref) if isinstance(ref, (int, float)) and ref > 0 else median
        ratio = float(v) / base if base else None
        old = scores[p][0]
        if ratio is not None and (old is None or ratio > old):
            scores[p] = (ratio, float(v))
    return scores, median


def suspects(nodes: Sequence[str], scores: Mapping[Pair, tuple[float | None, float | None]],
             slow_ratio: float) -> tuple[list[str], list[str]]:
    """(suspects, good): suspects had only slow or failed pairs; good nodes had a passing one."""
    bad: list[str] = []
    good: list[str] = []
    for node in nodes:
        mine = [r for p, (r, _) in scores.items() if node in p]
        if not mine:
            continue
        if any(r is not None and r >= slow_ratio for r in mine):
            good.append(node)
        else:
            bad.append(node)
    return bad, good


def reference_pair(busy: Iterable[Pair], good: Sequence[str], prefer: Sequence[Pair] = ()) -> Pair | None:
    """Two known-good nodes outside this round, measured beside it as the same-moment reference."""
    used = {x for p in busy for x in p}
    free = [g for g in good if g not in used]
    return next((p for p in prefer if p[0] in free and p[1] in free),
                (free[0], free[1]) if len(free) >= 2 else None)


def retry_rounds(slow: Sequence[Pair], good: Sequence[str], prefer: Sequence[Pair], limit: int) -> list[
        tuple[list[Pair], Pair | None]]:
    """Rounds re-measuring slow ring pairs, disjoint, each beside a reference pair when two good nodes are free."""
    rounds: list[tuple[list[Pair], Pair | None]] = []
    todo = list(slow)
    while todo and len(rounds) < max(1, limit):
        this: list[Pair] = []
        for p in todo:
            used = {x for q in this for x in q}
            if p[0] in used or p[1] in used:
                continue
            if this and reference_pair([*this, p], good) is None and reference_pair(this, good) is not None:
                continue  # keep two good nodes free for the reference
            this.append(p)
        rounds.append((this, reference_pair(this, good, prefer)))
        todo = [p for p in todo if p not in this]
    return rounds


def remeasure_pairs(bad: Sequence[str], good: Sequence[str], scores: Mapping[Pair, tuple[float | None, float | None]],
                    slow_ratio: float, done: Iterable[Pair] = ()) -> list[Pair]:
    """What runs again before the verdict (after the confirmation), but for the pairs in ``done``;
    ``bad`` and ``good`` are :func:`suspects` of the same ``scores``.

    - A slow or failed pair of two good nodes: a slow link, or a busy moment.
    - Each suspect with a figure, with the good node of its best pair so far: its pairs may all
      have been busy moments (a healthy node beside a degraded one in every round); a slow node
      is slow again. A suspect whose every pair failed (a dead link) keeps its FAIL.

    Asked again after the first re-measure: a suspect it clears turns its other slow pairs into
    pairs of two good nodes, measured again in turn, so that none is called a slow link unheard.
    """
    seen = {frozenset(p) for p in done}
    out = [p for p, (r, _) in scores.items() if (r or 0.0) < slow_ratio and p[0] in good and p[1] in good]
    for x in bad:
        mine = [(r, p) for p, (r, _) in scores.items() if x in p and r is not None]
        with_good = [(r, p) for r, p in mine if (p[1] if p[0] == x else p[0]) in good]
        if with_good:
            out.append(max(with_good)[1])
        elif mine and good:
            out.append((x, good[0]))
    return [p for i, p in enumerate(out) if frozenset(p) not in seen and p not in out[:i]]


def confirm_rounds(bad: Sequence[str], good: Sequence[str], done: Iterable[Pair], n_nodes: int) -> list[list[Pair]]:
    """Pair each suspect with a good node it has not met, each good node once per round.

    At most :func:`max_confirm_rounds` rounds; suspects beyond that keep their
    ring verdict (unconfirmed). A suspect that has met every good node already
    needs no new pair.
    """
    met = {frozenset(p) for p in done}
    limit = max_confirm_rounds(n_nodes)
    rounds: list[list[Pair]] = []
    todo = list(bad)
    while todo and len(rounds) < limit:
        used: set[str] = set()
        this: list[Pair] = []
        left: list[str] = []
        for s in todo:
            partner = next((g for g in good if g not in used and frozenset((s, g)) not in met), None)
            if partner is None:
                if any(frozenset((s, g)) not in met for g in good):
                    left.append(s)  # a good partner exists, just busy this round
                continue
            used.add(partner)
            this.append((s, partner))
        if not this:
            break
        rounds.append(this)
        todo = left
    return rounds


@dataclass(frozen=True)
class Row:
    """One line of the verdict table."""

    node: str
    check: str
    figure: float | None
    unit: str
    ratio: float | None
    verdict: str
    section: str  # "node" (per-node checks) or "pairwise"
    note: str = ""

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def node_rows(nodes: Sequence[str], figures: Mapping[str, Mapping[str, float | None]], checks: Sequence[tuple[str, str]],
              scores: Mapping[Pair, tuple[float | None, float | None]], slow_ratio: float) -> list[Row]:
    """The verdict table: per-node checks vs the median node, then pairwise (see :func:`pair_scores`)."""
    rows: list[Row] = []
    for check, unit in checks:
        values = {n: figures.get(n, {}).get(check) for n in nodes}
        if all(v is None for v in values.values()):
            continue
        med = _median(values.values())
        for n in nodes:
            ratio, v = verdict(values[n], med, slow_ratio)
            rows.append(Row(n, check, values[n], unit, ratio, v, "node"))
    node_verdict: dict[str, str] = {}
    for n in nodes:
        mine = {p: rv for p, rv in scores.items() if n in p}
        if not mine:
            continue
        got = [rv for rv in mine.values() if rv[0] is not None]
        ratio, fig = max(got, key=lambda rv: rv[0] or 0.0) if got else (None, None)
        v = FAIL if ratio is None else (SLOW if ratio < slow_ratio else PASS)
        node_verdict[n] = v
        note = f"best of {counted(len(mine), 'pair')}" + (f", {len(mine) - len(got)} failed" if len(got) < len(mine) else "")
        rows.append(Row(n, "pair busbw", fig, "GB/s", ratio, v, "pairwise", note))
    for p, (ratio, fig) in scores.items():
        v = FAIL if ratio is None else (SLOW if ratio < slow_ratio else PASS)
        if v in (SLOW, FAIL) and node_verdict.get(p[0]) == PASS and node_verdict.get(p[1]) == PASS:
            rows.append(Row(pair_key(p), "link", fig, "GB/s", ratio, v, "pairwise", "both nodes fine in other pairs"))
    return rows


def format_table(rows: Sequence[Row]) -> str:
    out = [f"{'node':<16} {'check':<14} {'figure':>16} {'ratio':>6}  verdict"]
    section = ""
    for r in rows:
        if r.section != section:
            section = r.section
            out.append("# per-node checks (vs the median node)" if section == "node" else
                       "# pairwise (vs the median node's best ring pair, or a reference pair run beside it)")
        fig = "-" if r.figure is None else f"{r.figure:.3g} {r.unit}"
        ratio = "-" if r.ratio is None else f"{r.ratio:.2f}"
        out.append(f"{r.node:<16} {r.check:<14} {fig:>16} {ratio:>6}  {r.verdict}" + (f"  ({r.note})" if r.note else ""))
    return "\n".join(out)


def exclude_text(rows: Sequence[Row]) -> tuple[str, list[str]]:
    """The ``--exclude @FILE`` file: every node (not link) that is SLOW or FAIL anywhere, one a line."""
    names = list(dict.fromkeys(r.node for r in rows if r.verdict in (SLOW, FAIL) and r.check != "link"))
    head = "# nodes torchhpc bench nodes found SLOW or FAIL; use: torchhpc run --exclude @THIS_FILE ...\n"
    return head + "".join(f"{n}\n" for n in names), names


def plan_counts(n: int) -> dict[str, int]:
    """Pairs and rounds for ``n`` nodes: the ring, one slow node's confirmation, the re-measure.

    The docs' table. A slow node (``n1``) makes its two ring pairs slow; it is the only suspect
    and gets one confirmation pair, then one re-measure with a good node. A slow link between
    two good nodes (the ring pair farthest from ``n1``) is re-measured once beside a reference pair.
    """
    names = [f"n{i}" for i in range(n)]
    ring = ring_pairs(names)
    bad = ["n1"] if n > 2 else []
    good = [x for x in names if x not in bad]
    confirm = confirm_rounds(bad, good, ring, n)
    link = [p for p in ring if "n1" not in p][n // 2 - 1 : n // 2] if n > 3 else []
    again = [("n1", next(g for g in good if not any(g in p for p in link)))] if bad else []
    retry = retry_rounds([*link, *again], good, [p for p in ring if p not in link], max_confirm_rounds(n))
    return {
        "nodes": n,
        "ring_pairs": len(ring),
        "ring_rounds": len(rounds_of(ring)),
        "confirm_pairs": sum(len(r) for r in confirm),
        "confirm_rounds": len(confirm),
        "max_confirm_rounds": max_confirm_rounds(n),
        "retry_pairs": sum(len(r) for r, _ in retry),
        "retry_rounds": len(retry),
        "all_pairs": n * (n - 1) // 2,
    }


def estimate_seconds(n: int) -> float:
    """The least time a run over ``n`` nodes can take under the budget model (no bandwidth assumed).

    The ring rounds and the most confirmation rounds (re-measure rounds only come when a
    link is slow; they share the confirmation's limit in this model).
    """
    ring_rounds = len(rounds_of(ring_pairs([str(i) for i in range(n)])))
    return STARTUP_SECONDS + NODE_CHECK_SECONDS * 2 + MIN_ROUND_SECONDS * (ring_rounds + max_confirm_rounds(n))


def check_budget(budget: float, n: int) -> None:
    need = estimate_seconds(n)
    if budget < need:
        raise UsageError(
            f"--budget {budget:g}s is too small for {n} nodes: start-up, per-node checks and "
            f"{len(rounds_of(ring_pairs([str(i) for i in range(n)])))} ring + up to {max_confirm_rounds(n)} "
            f"confirmation pair rounds need at least {need:.0f}s",
            f"give --budget {math.ceil(need / 30) * 30} or more (on a real cluster, minutes)",
        )
