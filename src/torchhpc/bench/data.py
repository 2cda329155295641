"""The check pattern: what each rank sends, and what each rank must end up with.

Rank ``q`` writes ``v(q, i) = (q + i) % 4 + 1`` at element ``i``: small
integers, exact in every datatype (bfloat16 included) so sums are exact up to
64 ranks and a tolerance only matters beyond. For ``-o prod`` it writes 2 where
``(q + i) % n == 0`` and 1 elsewhere, so every product is exactly 2 and never
overflows. Expected results use closed forms over the four residues of the
rank, so checking costs a few tensor operations whatever the world size.
"""

from __future__ import annotations

from typing import Any

__all__ = ["expected", "fill_send", "pattern"]

PERIOD = 4
PATTERN_MAX = PERIOD  # the largest value v() writes (bounds every partial sum by PATTERN_MAX * n)
REDUCING = ("all_reduce", "reduce", "reduce_scatter")


def pattern(q: Any, idx: Any, world: int, prod: bool) -> Any:
    """``v(q, i)`` as an int64 tensor (``q`` an int or a tensor of ranks)."""
    if prod:
        return ((q + idx) % world == 0).long() + 1
    return (q + idx) % PERIOD + 1


def _reduced(op: str, idx: Any, world: int) -> Any:
    """Reduction over ranks 0..world-1 of ``v(q, idx)``, as float64."""
    import torch

    if op == "prod":
        return torch.full_like(idx, 2, dtype=torch.float64)
    counts = [world // PERIOD + (1 if k < world % PERIOD else 0) for k in range(PERIOD)]
    vals = [((k + idx) % PERIOD + 1).to(torch.float64) for k in range(PERIOD)]
    if op in ("sum", "avg"):
        total = sum((c * v for c, v in zip(counts, vals) if c), torch.zeros_like(vals[0]))
        return total / world if op == "avg" else total
    present = [v for c, v in zip(counts, vals) if c]
    out = present[0]
    for v in present[1:]:
        out = torch.minimum(out, v) if op == "min" else torch.maximum(out, v)
    return out


def fill_send(name: str, send: Any, recv: Any, count: int, op: str, root: int, rank: int, world: int,
              in_place: bool) -> None:
    """Write this rank's input, and clear outputs so a stale result cannot pass the check."""
    import torch

    prod = op == "prod" and name in REDUCING
    dev = send.device
    if not in_place or name == "all_gather":  # in-place reduce_scatter: recv is a slice of send
        recv.zero_()
    if name == "broadcast" and rank != root:
        send.zero_()
        return
    idx = torch.arange(send.numel(), device=dev)
    send.copy_(pattern(rank, idx, world, prod))


def expected(name: str, count: int, op: str, root: int, rank: int, world: int, dtype: Any, device: Any) -> Any:
    """What this rank's output buffer must hold after one call, or ``None`` if it has no output."""
    import torch

    c, n = count, world
    if name in ("all_reduce", "reduce"):
        if name == "reduce" and rank != root:
            return None
        want = _reduced(op, torch.arange(c, device=device), n)
    elif name == "reduce_scatter":
        want = _reduced(op, rank * c + torch.arange(c, device=device), n)
    elif name == "broadcast":
        want = pattern(root, torch.arange(c, device=device), n, False)
    elif name == "all_gather":
        j = torch.arange(n * c, device=device)
        want = pattern(j // c, j % c, n, False)
    elif name == "all_to_all":
        j = torch.arange(n * c, device=device)
        want = pattern(j // c, rank * c + j % c, n, False)
    elif name == "sendrecv":
        want = pattern((rank - 1) % n, torch.arange(c, device=device), n, False)
    else:  # pragma: no cover - names come from COLLECTIVES
        raise ValueError(name)
    if not dtype.is_floating_point and not (op == "avg" and name in REDUCING):
        return want.to(torch.int64).to(dtype)  # integer sums wrap like the collective's do
    return want.to(torch.float64)
