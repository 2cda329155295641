"""What every doctor check is a function of: :class:`Context`, and what it returns: :class:`Check`."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from torchhpc.core.proc import Runner, default_runner
from torchhpc.errors import TorchHPCError

__all__ = ["STATUSES", "Check", "Context", "GiB", "MiB"]

STATUSES = ("pass", "warn", "fail", "skip")
GiB = 1024**3
MiB = 1024**2


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    detail: str
    hint: Optional[str] = None


@dataclass
class Context:
    """What the checks may look at; every part injectable."""

    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    runner: Runner = field(default_factory=default_runner)
    root: str = "/"
    in_job: Optional[bool] = None  # None: decide from the environment
    master: Optional[str] = None
    port: Optional[int] = None
    gpus: Optional[int] = None  # requested GPUs per node, if known better than the environment
    python: str = sys.executable
    _torch: Optional[dict[str, Any]] = None

    def __post_init__(self) -> None:
        if self.in_job is None:
            e = self.environ
            self.in_job = any(k in e for k in ("SLURM_STEP_ID", "PBS_JOBID", "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"))

    def path(self, p: str) -> Path:
        return Path(self.root) / p.lstrip("/")

    def torch_info(self) -> dict[str, Any]:
        """torch's versions and devices, probed in a child process (a broken CUDA stack cannot crash us)."""
        if self._torch is None:
            try:
                done = self.runner.run([self.python, "-c", _TORCH_PROBE], check=False, timeout=120)
                lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
                self._torch = json.loads(lines[-1]) if lines else {"error": (done.stderr.strip().splitlines() or ["no output"])[-1]}
            except (TorchHPCError, ValueError) as e:
                self._torch = {"error": str(e)}
        return self._torch


_TORCH_PROBE = r"""
import json, sys
try:
    import torch
except Exception as e:
    print(json.dumps({"error": "%s: %s" % (type(e).__name__, e)})); sys.exit(0)
out = {"version": torch.__version__, "file": torch.__file__, "cuda": torch.version.cuda,
       "hip": getattr(torch.version, "hip", None), "cuda_available": torch.cuda.is_available()}
out["device_count"] = torch.cuda.device_count() if out["cuda_available"] else 0
try:
    out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
except Exception:
    out["nccl"] = None
import torch.distributed as dist
out["nccl_backend"] = dist.is_available() and dist.is_nccl_available()
out["gloo_backend"] = dist.is_available() and dist.is_gloo_available()
print(json.dumps(out))
"""
