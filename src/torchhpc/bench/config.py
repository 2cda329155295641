"""The benchmark's settings, named as nccl-tests names its flags.

Kept apart from the CLI so a script, a test or the sweep can build one without
argparse, and torch-free so ``torchhpc bench --help`` stays fast.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Optional

from torchhpc.bench.collectives import OPS, dtype_name, parse_collectives, sizes
from torchhpc.errors import UsageError

__all__ = ["AVERAGE_MODES", "CORRUPT_VAR", "BenchConfig"]

# Test-only hook: a rank number; that rank corrupts its result after the
# correctness run so #wrong > 0 can be shown end to end (never set it otherwise).
CORRUPT_VAR = "TORCHHPC_BENCH_CORRUPT_RANK"
AVERAGE_MODES = {0: "rank 0", 1: "average", 2: "minimum", 3: "maximum"}


@dataclass(frozen=True)
class BenchConfig:
    """One benchmark run. Defaults are nccl-tests' (32M only, 20 timed calls)."""

    collectives: tuple[str, ...] = ("all_reduce",)
    minbytes: int = 32 << 20
    maxbytes: int = 32 << 20
    stepfactor: float = 1.0
    stepbytes: int = 1 << 20
    iters: int = 20
    warmup: int = 5
    check: int = 1
    datatype: str = "float"
    op: str = "sum"
    root: int = 0
    average: int = 1
    device: str = "auto"  # auto | cpu | cuda
    json: Optional[str] = None
    plot: Optional[str] = None
    min_bw: Optional[float] = None
    corrupt_rank: Optional[int] = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.minbytes > self.maxbytes:
            # nccl-tests silently runs nothing; say what happened instead.
            raise UsageError(
                f"-b/--minbytes {self.minbytes} is larger than -e/--maxbytes {self.maxbytes}",
                "give -e at least as large as -b (e.g. -b 8 -e 128M)",
            )
        parse_collectives(list(self.collectives))
        if self.iters < 1:
            raise UsageError(f"-n/--iters {self.iters} must be at least 1")
        if self.warmup < 0:
            raise UsageError(f"-w/--warmup_iters {self.warmup} must not be negative")
        if self.op not in OPS:
            raise UsageError(f"-o/--op {self.op!r} is not a reduction", f"choose from: {', '.join(OPS)}")
        dtype_name(self.datatype)
        if self.average not in AVERAGE_MODES:
            raise UsageError(
                f"-a/--average {self.average} is not a mode",
                "0 = rank 0's time, 1 = average over ranks, 2 = minimum, 3 = maximum",
            )
        if self.device not in ("auto", "cpu", "cuda"):
            raise UsageError(f"--device {self.device!r} must be auto, cpu or cuda")
        if self.min_bw is not None and self.min_bw < 0:
            raise UsageError(f"--min-bw {self.min_bw} must not be negative")
        if self.root < 0:
            raise UsageError(f"-r/--root {self.root} must not be negative")

    @property
    def dtype(self) -> str:
        return dtype_name(self.datatype)

    def sizes(self) -> list[int]:
        return sizes(self.minbytes, self.maxbytes, self.stepfactor, self.stepbytes)

    def collective_names(self) -> list[str]:
        return [c.name for c in parse_collectives(list(self.collectives))]

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("corrupt_rank")
        d["collectives"] = self.collective_names()
        d["datatype"] = self.dtype
        return d

    def with_env_hooks(self) -> BenchConfig:
        """Apply the test-only corruption hook from the environment (see ``CORRUPT_VAR``)."""
        raw = os.environ.get(CORRUPT_VAR)
        if raw is None or raw == "":
            return self
        try:
            rank = int(raw)
        except ValueError:
            raise UsageError(f"{CORRUPT_VAR}={raw!r} is not a rank number") from None
        return replace(self, corrupt_rank=rank)
