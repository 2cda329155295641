"""The check pattern against each collective's definition, simulated rank by rank in plain torch.

No process group: every rank's input is built with ``fill_send`` and the
collective's result is computed from its definition, then compared with the
closed form ``expected`` uses. A wrong closed form would make every real run
report #wrong > 0 (or hide real errors).
"""

from __future__ import annotations

import pytest

from tests.conftest import need

torch = need("torch")

from torchhpc.bench.collectives import COLLECTIVES  # noqa: E402
from torchhpc.bench.data import expected, fill_send  # noqa: E402
from torchhpc.bench.runner import _count_wrong  # noqa: E402

REDUCE = {
    "sum": lambda xs: torch.stack(xs).sum(0),
    "prod": lambda xs: torch.stack(xs).prod(0),
    "min": lambda xs: torch.stack(xs).min(0).values,
    "max": lambda xs: torch.stack(xs).max(0).values,
    "avg": lambda xs: torch.stack(xs).mean(0),
}


def _inputs(name: str, n: int, c: int, op: str, root: int, dtype: torch.dtype) -> list[torch.Tensor]:
    lay = COLLECTIVES[name].layout(c * 4 * (n if COLLECTIVES[name].split else 1), n, 4)
    out = []
    for r in range(n):
        send = torch.empty(lay.send, dtype=dtype)
        recv = torch.empty(lay.recv, dtype=dtype)
        fill_send(name, send, recv, c, op, root, r, n, False)
        out.append(send.to(torch.float64))
    return out


def _by_definition(name: str, sends: list[torch.Tensor], n: int, c: int, op: str, root: int, r: int) -> torch.Tensor:
    if name in ("all_reduce", "reduce"):
        return REDUCE[op](sends)
    if name == "reduce_scatter":
        return REDUCE[op](sends)[r * c:(r + 1) * c]
    if name == "broadcast":
        return sends[root]
    if name == "all_gather":
        return torch.cat(sends)
    if name == "all_to_all":
        return torch.cat([sends[q][r * c:(r + 1) * c] for q in range(n)])
    if name == "sendrecv":
        return sends[(r - 1) % n]
    raise AssertionError(name)


CASES = [(name, op) for name, coll in sorted(COLLECTIVES.items())
         for op in (("sum", "prod", "min", "max", "avg") if coll.reduces else ("sum",))]


@pytest.mark.parametrize(("name", "op"), CASES)
@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_expected_matches_definition(name: str, n: int, op: str) -> None:
    c, root = 37, n - 1
    sends = _inputs(name, n, c, op, root, torch.float32)
    for r in range(n):
        want = expected(name, c, op, root, r, n, torch.float32, "cpu")
        if name == "reduce" and r != root:
            assert want is None
            continue
        got = _by_definition(name, sends, n, c, op, root, r)
        assert torch.equal(want.to(torch.float64), got), (name, n, op, r)
        assert _count_wrong(got.to(torch.float32), want, op, n) == 0
        bad = got.to(torch.float32).clone()
        bad[3] += 1
        assert _count_wrong(bad, want, op, n) == 1


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int32", "int64", "float16", "bfloat16", "float64"])
def test_every_dtype_checks_exactly(dtype: str) -> None:
    dt = getattr(torch, dtype)
    n, c = 70, 50  # sums up to 4 * 70 = 280: wraps int8/uint8, rounds in bfloat16
    sends = [s.to(dt) for s in _inputs("all_reduce", n, c, "sum", 0, dt)]
    acc = sends[0].clone()
    for s in sends[1:]:
        acc += s  # in the dtype, like a ring reduction would
    want = expected("all_reduce", c, "sum", 0, 0, n, dt, "cpu")
    assert _count_wrong(acc, want, "sum", n) == 0
    acc[0] = -acc[0] - 1  # what the runner's corruption hook does
    assert _count_wrong(acc, want, "sum", n) == 1


def test_stale_output_is_cleared() -> None:
    recv = torch.full((8,), 3.0)
    fill_send("all_gather", torch.empty(4), recv, 4, "sum", 0, 0, 2, False)
    assert recv.eq(0).all()
    send = torch.full((4,), 9.0)
    fill_send("broadcast", send, send, 4, "sum", 0, 1, 2, False)
    assert send.eq(0).all()  # a non-root must not already hold the root's data
