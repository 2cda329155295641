"""torchhpc.dist.checkpoint on a GPU: DDP and FSDP2 models on CUDA (NCCL), resumed bit for bit.

The CPU suite checks the helper with gloo (tests/integration/test_checkpoint_fsdp.py). What only a GPU
shows: parameters, Adam's moments and DTensor shards in CUDA memory, the asynchronous save's copy of them
into host buffers, and the CUDA RNG state (dropout draws from it) carried across a restart. This runs
the CPU tests' own script, tests/integration/scripts/ckpt_dcp.py (its ranks train on their CUDA device
there), under ``torchhpc run -n RANKS`` twice: ``train`` saves each of four models (DDP and FSDP2, blocking
and not) at step 3 and goes on to 5; ``resume`` restores step 3 and goes on to 5. Rank 0's full dumps of
both runs must be equal (``torch.equal``) at step 3 and at step 5, model and optimizer.

    python benchmarks/gpu_checkpoint.py [--ranks 1] [--root DIR]

Prints a line per model and exits 0 when every one resumed bit for bit, 1 otherwise. One rank per GPU:
``--ranks 1`` on a one-GPU machine. cuBLAS runs deterministically here (CUBLAS_WORKSPACE_CONFIG), so a
difference is the checkpoint's, not the GPU's summation order.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tests" / "integration" / "scripts" / "ckpt_dcp.py"
KINDS = ("ddp-sync", "ddp-async", "fsdp-sync", "fsdp-async")


def differences(a: Any, b: Any, where: str = "") -> list[str]:
    """Where ``a`` and ``b`` differ: tensors by dtype, shape and torch.equal; containers recursively."""
    import torch

    if isinstance(a, torch.Tensor):
        if not isinstance(b, torch.Tensor) or a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a, b):
            return [where]
        return []
    if isinstance(a, dict):
        if not isinstance(b, dict) or set(a) != set(b):
            return [f"{where}: keys"]
        return [d for k in a for d in differences(a[k], b[k], f"{where}/{k}")]
    if isinstance(a, (list, tuple)):
        if not isinstance(b, (list, tuple)) or len(a) != len(b):
            return [f"{where}: length"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{where}[{i}]")]
    return [] if a == b else [where]


def launch(ranks: int, root: Path, mode: str) -> float:
    env = {**os.environ, "CUBLAS_WORKSPACE_CONFIG": ":4096:8", "PYTHONPATH": str(REPO / "src")}
    t0 = time.monotonic()
    cp = subprocess.run([sys.executable, "-m", "torchhpc", "run", "-n", str(ranks), str(SCRIPT), str(root), mode],
                        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    secs = time.monotonic() - t0
    if cp.returncode != 0 or "DONE" not in cp.stdout:
        print(cp.stdout + cp.stderr, file=sys.stderr)
        raise SystemExit(f"Error: the {mode} run failed (exit {cp.returncode}); its output is above")
    return secs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=1, help="ranks (one per GPU)")
    p.add_argument("--root", default="", help="where the runs write (default: a new temporary directory)")
    a = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("Error: no CUDA GPU here\nHINT: run this on a GPU node; the CPU suite covers gloo", file=sys.stderr)
        return 2
    root = Path(a.root or tempfile.mkdtemp(prefix="torchhpc-gpu-ckpt."))
    root.mkdir(parents=True, exist_ok=True)
    print(f"# {torch.cuda.get_device_name(0)}, torch {torch.__version__}, {a.ranks} rank(s), in {root}")
    secs = {mode: launch(a.ranks, root, mode) for mode in ("train", "resume")}
    bad = 0
    for kind in KINDS:
        said = []
        for step in (3, 5):
            first = torch.load(root / f"{kind}.train.{step}.pt", weights_only=False)
            again = torch.load(root / f"{kind}.resume.{step}.pt", weights_only=False)
            diff = differences(first["model"], again["model"], "model") + differences(first["optim"], again["optim"], "optim")
            bad += bool(diff)
            said.append(f"step {step} " + ("equal" if not diff else f"DIFFERS at {', '.join(diff[:3])}"))
        print(f"{kind:10s} {'; '.join(said)}")
    print(f"train {secs['train']:.1f} s, resume {secs['resume']:.1f} s (each a whole `torchhpc run`)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
