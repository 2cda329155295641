"""Bus-bandwidth factors, buffer layouts, size sweeps and config checks (pure, no torch)."""

from __future__ import annotations

import pytest

from torchhpc.bench.collectives import (
    COLLECTIVES,
    bandwidth,
    dtype_name,
    get_collective,
    parse_collectives,
    sizes,
)
from torchhpc.bench.config import BenchConfig
from torchhpc.errors import UsageError

# nccl-tests doc/PERFORMANCE.md, written out independently of the module's lambdas.
FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "sendrecv": lambda n: 1.0,
}


def test_every_collective_has_a_factor() -> None:
    assert set(COLLECTIVES) == set(FACTORS)


@pytest.mark.parametrize("name", sorted(FACTORS))
@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 8, 16, 64, 1024])
def test_busbw_factor_for_every_world_size(name: str, n: int) -> None:
    coll = COLLECTIVES[name]
    assert coll.factor(n) == pytest.approx(FACTORS[name](n))
    layout = coll.layout(64 << 20, n, 4)
    algbw, busbw = bandwidth(coll, layout, 0.5, n)
    assert algbw == pytest.approx(layout.size / 0.5 / 1e9)
    assert busbw == pytest.approx(algbw * FACTORS[name](n))


def test_known_numbers() -> None:
    # 8 ranks, 1 GB all_reduce in 0.1 s: algbw 10 GB/s, busbw 17.5 GB/s.
    ar = COLLECTIVES["all_reduce"]
    layout = ar.layout(1_000_000_000, 8, 4)
    assert (layout.count, layout.size) == (250_000_000, 1_000_000_000)
    assert bandwidth(ar, layout, 0.1, 8) == pytest.approx((10.0, 17.5))
    # one rank: busbw is 0 by definition (nccl-tests' "Avg bus bandwidth = 0" on one GPU)
    assert bandwidth(ar, ar.layout(1 << 20, 1, 4), 0.001, 1)[1] == 0.0
    assert bandwidth(ar, layout, 0.0, 8) == (0.0, 0.0)


@pytest.mark.parametrize(
    ("name", "n", "size", "count", "send", "recv"),
    [
        ("all_reduce", 4, 1000, 250, 250, 250),
        ("broadcast", 4, 1024, 256, 256, 256),
        ("sendrecv", 2, 4096, 1024, 1024, 1024),
        # split collectives: count is per rank (per peer for all_to_all), size the larger buffer
        ("all_gather", 4, 1024, 64, 64, 256),
        ("reduce_scatter", 4, 1024, 64, 256, 64),
        ("all_to_all", 4, 1024, 64, 256, 256),
        ("all_gather", 8, 16, 0, 0, 0),  # too small to give every rank one float
    ],
)
def test_layouts(name: str, n: int, size: int, count: int, send: int, recv: int) -> None:
    lay = COLLECTIVES[name].layout(size, n, 4)
    assert (lay.count, lay.send, lay.recv) == (count, send, recv)
    assert lay.size == max(send, recv) * 4


def test_placements_follow_torch_api() -> None:
    inplace_only = {n for n, c in COLLECTIVES.items() if c.in_place and not c.out_of_place}
    oop_only = {n for n, c in COLLECTIVES.items() if c.out_of_place and not c.in_place}
    assert inplace_only == set()  # all_reduce, broadcast, reduce: out-of-place is copy + collective
    assert oop_only == {"all_to_all", "sendrecv"}


def test_sizes_like_nccl_tests() -> None:
    s = sizes(8, 128 << 20, 2)
    assert s[0] == 8 and s[-1] == 128 << 20 and len(s) == 25
    assert sizes(1 << 20, 4 << 20, 1, 1 << 20) == [1 << 20, 2 << 20, 3 << 20, 4 << 20]
    assert sizes(1024, 64 << 20, 4)[-1] == 64 << 20
    assert sizes(0, 3, 2) == [0, 1, 2]
    with pytest.raises(UsageError, match="-b 10 / -e 5"):
        sizes(10, 5)
    with pytest.raises(UsageError, match="stepbytes"):
        sizes(1, 5, 1, 0)


def test_names_and_aliases() -> None:
    assert get_collective("all_reduce_perf").name == "all_reduce"
    assert get_collective("AllReduce").name == "all_reduce"
    assert [c.name for c in parse_collectives(["all_reduce,broadcast", "all_reduce", "alltoall"])] == [
        "all_reduce", "broadcast", "all_to_all"]
    with pytest.raises(UsageError) as e:
        get_collective("allredcue", "-t")
    assert "'allredcue'" in str(e.value) and "all_gather" in str(e.value.hint)
    assert dtype_name("fp32") == "float" and dtype_name("bf16") == "bfloat16"
    with pytest.raises(UsageError, match="float128"):
        dtype_name("float128")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"minbytes": 10, "maxbytes": 5}, "-b/--minbytes 10"),
        ({"iters": 0}, "-n/--iters 0"),
        ({"op": "xor"}, "-o/--op 'xor'"),
        ({"average": 7}, "-a/--average 7"),
        ({"collectives": ("all_reduc",)}, "'all_reduc'"),
        ({"datatype": "complex"}, "'complex'"),
        ({"min_bw": -1.0}, "--min-bw -1"),
    ],
)
def test_config_rejects_bad_values_naming_them(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(UsageError, match=match):
        BenchConfig(**kwargs)  # type: ignore[arg-type]


def test_config_env_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = BenchConfig()
    monkeypatch.delenv("TORCHHPC_BENCH_CORRUPT_RANK", raising=False)
    assert cfg.with_env_hooks().corrupt_rank is None
    monkeypatch.setenv("TORCHHPC_BENCH_CORRUPT_RANK", "1")
    assert cfg.with_env_hooks().corrupt_rank == 1
    monkeypatch.setenv("TORCHHPC_BENCH_CORRUPT_RANK", "x")
    with pytest.raises(UsageError, match="'x'"):
        cfg.with_env_hooks()
    d = BenchConfig(datatype="fp32", collectives=("allreduce",)).as_dict()
    assert d["datatype"] == "float" and d["collectives"] == ["all_reduce"] and "corrupt_rank" not in d
