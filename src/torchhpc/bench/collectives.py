"""One record per collective: buffer sizes and the bus-bandwidth factor (pure, no torch).

The arithmetic follows nccl-tests (``src/*.cu`` and ``doc/PERFORMANCE.md``):
the ``size`` column is the larger of the send and receive buffer of one rank,
``count`` is the per-rank (per-peer for all_to_all) element count that the
collective is called with, ``algbw = size / time`` in GB/s (1 GB = 1e9 bytes)
and ``busbw = algbw * factor`` where the factor turns the algorithm bandwidth
into the bandwidth each link must carry, so that numbers from different world
sizes compare with the hardware's link speed:

=================  ==============
collective         factor
=================  ==============
all_reduce         2 (n - 1) / n
all_gather         (n - 1) / n
reduce_scatter     (n - 1) / n
all_to_all         (n - 1) / n
broadcast, reduce  1
sendrecv           1
=================  ==============

Placements, as nccl-tests: out-of-place reads one buffer and writes another,
in-place works in one buffer. ``torch.distributed``'s all_reduce, broadcast and
reduce take a single buffer, so their out-of-place call is what a torch program
writes for it: copy the input into the output buffer, then the collective on the
output (the copy is timed too: a device copy, small beside the collective at the
sizes that measure bandwidth). all_to_all and sendrecv are out-of-place only
(the same buffer would race).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torchhpc.errors import UsageError

__all__ = [
    "COLLECTIVES",
    "DTYPES",
    "OPS",
    "Collective",
    "Layout",
    "bandwidth",
    "get_collective",
    "parse_collectives",
]

# nccl-tests' datatype names -> (torch dtype attribute, bytes per element).
DTYPES: dict[str, tuple[str, int]] = {
    "int8": ("int8", 1),
    "uint8": ("uint8", 1),
    "int32": ("int32", 4),
    "int64": ("int64", 8),
    "half": ("float16", 2),
    "float": ("float32", 4),
    "double": ("float64", 8),
    "bfloat16": ("bfloat16", 2),
}
DTYPE_ALIASES = {
    "char": "int8", "int": "int32", "float16": "half", "fp16": "half", "float32": "float",
    "fp32": "float", "float64": "double", "fp64": "double", "bf16": "bfloat16", "long": "int64",
}
# nccl-tests' reduction names; avg exists only in NCCL (gloo has no ReduceOp.AVG).
OPS = ("sum", "prod", "min", "max", "avg")


@dataclass(frozen=True)
class Layout:
    """Buffer geometry of one collective call on one rank, in elements."""

    count: int  # what the ``count`` column shows (per rank, or per peer)
    send: int
    recv: int
    elem: int  # bytes per element

    @property
    def size(self) -> int:
        """The ``size`` column: the larger buffer of one rank, in bytes."""
        return max(self.send, self.recv) * self.elem


@dataclass(frozen=True)
class Collective:
    """What nccl-tests keeps per collective, as data."""

    name: str
    factor: Callable[[int], float]
    split: bool  # the size is split over ranks (count = size / (n * elem))
    reduces: bool  # has a reduction op (the ``redop`` column)
    rooted: bool  # has a root (the ``root`` column)
    out_of_place: bool
    in_place: bool
    describe: str

    def layout(self, size: int, world_size: int, elem: int) -> Layout:
        """Per-rank buffers for a requested ``size`` in bytes (rounded down to whole elements)."""
        if world_size < 1:
            raise UsageError(f"world size {world_size} must be at least 1")
        if self.split:
            per = size // (world_size * elem)
            if self.name == "all_gather":
                return Layout(per, per, per * world_size, elem)
            if self.name == "reduce_scatter":
                return Layout(per, per * world_size, per, elem)
            return Layout(per, per * world_size, per * world_size, elem)  # all_to_all
        count = size // elem
        return Layout(count, count, count, elem)


def _ring(n: int) -> float:
    return (n - 1) / n


COLLECTIVES: dict[str, Collective] = {
    c.name: c
    for c in (
        Collective("all_reduce", lambda n: 2 * (n - 1) / n, False, True, False, True, True,
                   "every rank ends with the reduction of all ranks' buffers"),
        Collective("all_gather", _ring, True, False, False, True, True,
                   "every rank ends with the concatenation of all ranks' buffers"),
        Collective("reduce_scatter", _ring, True, True, False, True, True,
                   "every rank ends with its slice of the reduction"),
        Collective("all_to_all", _ring, True, False, False, True, False,
                   "every rank sends a distinct slice to every other rank"),
        Collective("broadcast", lambda n: 1.0, False, False, True, True, True,
                   "the root's buffer is copied to every rank"),
        Collective("reduce", lambda n: 1.0, False, True, True, True, True,
                   "the root ends with the reduction of all ranks' buffers"),
        Collective("sendrecv", lambda n: 1.0, False, False, False, True, False,
                   "each rank sends to rank+1 and receives from rank-1 at once"),
    )
}
ALIASES = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
           "alltoall": "all_to_all", "bcast": "broadcast", "send_recv": "sendrecv"}


def get_collective(name: str, source: str = "collective") -> Collective:
    key = name.strip().lower().replace("-", "_")
    key = key.removesuffix("_perf")  # accept nccl-tests binary names: all_reduce_perf
    key = ALIASES.get(key, key)
    if key not in COLLECTIVES:
        raise UsageError(
            f"{source} {name!r} is not a collective",
            f"choose from: {', '.join(COLLECTIVES)} (comma-separated for several)",
        )
    return COLLECTIVES[key]


def parse_collectives(items: list[str] | tuple[str, ...], source: str = "-t/--collective") -> list[Collective]:
    """``["all_reduce,broadcast", "reduce"]`` -> three records, duplicates dropped, order kept."""
    out: list[Collective] = []
    for item in items:
        for part in str(item).split(","):
            if not part.strip():
                continue
            c = get_collective(part, source)
            if c not in out:
                out.append(c)
    return out


def dtype_name(name: str, source: str = "-d/--datatype") -> str:
    """Normalise a datatype to nccl-tests' spelling (``float32`` -> ``float``)."""
    key = name.strip().lower()
    key = DTYPE_ALIASES.get(key, key)
    if key not in DTYPES:
        raise UsageError(f"{source} {name!r} is not a datatype", f"choose from: {', '.join(DTYPES)}")
    return key


def bandwidth(collective: Collective, layout: Layout, seconds: float, world_size: int) -> tuple[float, float]:
    """``(algbw, busbw)`` in GB/s (1e9 bytes/s) for one call lasting ``seconds``."""
    if seconds <= 0:
        return 0.0, 0.0
    algbw = layout.size / seconds / 1e9
    return algbw, algbw * collective.factor(world_size)


def sizes(minbytes: int, maxbytes: int, stepfactor: float = 1.0, stepbytes: int = 1 << 20) -> list[int]:
    """nccl-tests' size sweep: multiply by ``-f`` when it is above 1, else add ``-i`` bytes."""
    if minbytes < 0 or maxbytes < minbytes:
        raise UsageError(
            f"-b {minbytes} / -e {maxbytes}: the sweep needs 0 <= minbytes <= maxbytes",
            "e.g. -b 8 -e 128M -f 2",
        )
    if stepfactor <= 1 and stepbytes <= 0:
        raise UsageError(f"-i/--stepbytes {stepbytes} must be positive when -f is 1 or less")
    out: list[int] = []
    size = minbytes
    while size <= maxbytes:
        out.append(size)
        if stepfactor > 1:
            nxt = int(size * stepfactor)
            if nxt <= size:  # -b 0 -f 2 would never grow
                nxt = size + 1
            size = nxt
        else:
            size += stepbytes
        if len(out) > 10000:
            raise UsageError("the size sweep has more than 10000 sizes", "raise -i or use -f 2")
    return out
