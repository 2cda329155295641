"""``torchhpc bench gpu``: is this node's GPU as fast as its spec sheet says?

Four figures, each timed with CUDA events after a warm-up: dense matmul
TFLOP/s (fp32 with TF32 off, TF32, bf16), device memory bandwidth from a
device-to-device copy (bytes read + written per second, the way vendors count
HBM bandwidth), pinned host<->device copy bandwidth (PCIe/C2C), and a
LayerNorm forward/backward timing (the helper of the HPC_helper guide: a
memory-bound kernel that shows a misconfigured node at once). Figures are
printed beside the device's published dense peak where we know it; a node
far below its peak has a clock, power or thermal problem, or a busy GPU.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from typing import Any, Optional

__all__ = ["HEALTHY", "KNOWN_PEAKS", "expected_figure", "gpu_check", "known_peak"]

Emit = Callable[[str], None]

# Published dense (non-sparse) peaks: TFLOP/s for fp32 / tf32 / bf16, and memory GB/s.
# Matched by substring of torch.cuda.get_device_name(), most specific first.
KNOWN_PEAKS: tuple[tuple[str, dict[str, float]], ...] = (
    ("GH200", {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "mem": 4000.0}),  # before H200: "GH200" contains it
    ("H200", {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "mem": 4800.0}),
    ("H100 PCIe", {"fp32": 51.0, "tf32": 378.0, "bf16": 756.0, "mem": 2000.0}),
    ("H100 NVL", {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "mem": 3900.0}),
    ("H100", {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "mem": 3350.0}),  # SXM5
    ("A100-SXM4-80GB", {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "mem": 2039.0}),
    ("A100 80GB PCIe", {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "mem": 1935.0}),
    ("A100", {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "mem": 1555.0}),  # 40GB
    ("L40S", {"fp32": 91.6, "tf32": 183.0, "bf16": 362.05, "mem": 864.0}),
    ("V100", {"fp32": 15.7, "mem": 900.0}),
    ("MI250X", {"fp32": 47.9, "bf16": 191.5, "mem": 1638.4}),  # per GCD: torch sees each GCD as a device
    ("MI300X", {"fp32": 163.4, "tf32": 653.7, "bf16": 1307.4, "mem": 5300.0}),
)


# What a healthy card of a kind reaches with this module's own measurements (dense bf16 8192³ matmul
# TFLOP/s, device-to-device copy GB/s read + write) and with torchvision's ResNet-50 training step
# (224 px, batch 128, bf16 autocast, channels_last, SGD; img/s), where one was measured on a card in
# good order. Keyed like KNOWN_PEAKS. Datasheet peaks are boost-clock ceilings a dense kernel does not
# reach under the power limit (an H100 SXM gives ~0.81 of its bf16 peak), so judging against them
# would fail healthy nodes.
HEALTHY: dict[str, dict[str, float]] = {
    # H100 80GB HBM3 (SXM), torch 2.11.0+cu130, 2026-11-22; bench gpu and a hand-written loop agreed.
    "H100": {"bf16": 800.0, "mem": 3030.0, "resnet50_img_s": 3719.0},
    # H200 141 GB, torch 2.11.0+cu130, 2026-10-28 and 2026-11-04: 769-798 TFLOP/s, ~4.3 TB/s; 2026-11-26:
    # 802 TFLOP/s, 4259 GB/s, and the same hand-written ResNet-50 loop at 4343 img/s (benchmarks/gpu_training.py).
    "H200": {"bf16": 780.0, "mem": 4300.0, "resnet50_img_s": 4340.0},
}
# Where no card was measured: the share of the datasheet figure a healthy card typically reaches.
TYPICAL_SHARE = {"fp32": 0.85, "tf32": 0.75, "bf16": 0.78, "mem": 0.88}


def _match(name: str) -> str | None:
    return next((key for key, _ in KNOWN_PEAKS if key.lower() in name.lower()), None)


def known_peak(name: str) -> dict[str, float]:
    key = _match(name)
    return dict(KNOWN_PEAKS)[key] if key else {}


def expected_figure(name: str, what: str) -> tuple[float, str] | None:
    """What a healthy ``name`` reaches for ``what`` (bf16, mem, resnet50_img_s ...) and where that comes from."""
    key = _match(name)
    if key is None:
        return None
    measured = HEALTHY.get(key, {}).get(what)
    if measured is not None:
        return measured, f"a healthy {key}"
    peak = dict(KNOWN_PEAKS)[key].get(what)
    if peak is not None and what in TYPICAL_SHARE:
        return peak * TYPICAL_SHARE[what], f"{TYPICAL_SHARE[what]:.2f} of the {key} datasheet"
    return None


def _timed(fn: Callable[[], Any], iters: int, warmup: int = 3) -> float:
    """Seconds per call, CUDA events around ``iters`` back-to-back calls."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def _matmul(n: int, kind: str) -> float:
    import torch

    dtype = torch.bfloat16 if kind == "bf16" else torch.float32
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = kind == "tf32"
    try:
        sec = _timed(lambda: torch.mm(a, b), iters=10)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    return 2 * n**3 / sec / 1e12


def _copy_bw(nbytes: int) -> dict[str, float]:
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    d2d = _timed(lambda: dst.copy_(src), iters=20)
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    h2d = _timed(lambda: src.copy_(host, non_blocking=True), iters=10)
    d2h = _timed(lambda: host.copy_(src, non_blocking=True), iters=10)
    return {"d2d": 2 * nbytes / d2d / 1e9, "h2d": nbytes / h2d / 1e9, "d2h": nbytes / d2h / 1e9}


def _layernorm(tokens: int = 8192, hidden: int = 4096) -> dict[str, float]:
    import torch

    out: dict[str, float] = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        ln = torch.nn.LayerNorm(hidden, device="cuda", dtype=dtype)
        x = torch.randn(tokens, hidden, device="cuda", dtype=dtype, requires_grad=True)
        grad = torch.randn_like(x)

        def forward(ln: Any = ln, x: Any = x) -> Any:
            return ln(x)

        def fwd_bwd(ln: Any = ln, x: Any = x, grad: Any = grad) -> None:
            ln(x).backward(grad)

        fwd = _timed(forward, iters=20)
        both = _timed(fwd_bwd, iters=20)
        out[f"{name}_fwd_ms"] = fwd * 1e3
        out[f"{name}_fwd_bwd_ms"] = both * 1e3
        # forward reads x, writes y: the memory-bound floor of the kernel
        out[f"{name}_fwd_GBps"] = 2 * x.numel() * x.element_size() / fwd / 1e9
    return out


def _line(label: str, value: float, unit: str, peak: Optional[float]) -> str:
    if peak:
        return f"  {label:<34} {value:10.1f} {unit:<8} peak {peak:8.1f}  ({100 * value / peak:5.1f}% of peak)"
    return f"  {label:<34} {value:10.1f} {unit:<8} (peak unknown for this device)"


def gpu_check(matmul_n: int = 8192, copy_bytes: int = 1 << 30, json_path: str | None = None,
              emit: Emit = print) -> int:
    """Measure and print; 0 also when there is no GPU (then it says so and measures nothing)."""
    import torch

    host = socket.gethostname()
    if not torch.cuda.is_available():
        emit(f"No GPU on {host}: torch {torch.__version__} sees no CUDA/ROCm device "
             f"(CUDA build: {torch.version.cuda or 'none'}). Nothing to measure.")
        emit("Run it where the GPUs are, e.g. `srun -N1 --gpus 1 torchhpc bench gpu`, "
             "or `torchhpc run --scheduler slurm --gpus-per-node 1 -m torchhpc.bench gpu --wait`.")
        return 0
    idx = torch.cuda.current_device()
    name = torch.cuda.get_device_name(idx)
    props = torch.cuda.get_device_properties(idx)
    peaks = known_peak(name)
    emit(f"# torchhpc bench gpu on {host}: device {idx} {name}, {props.total_memory / 2**30:.0f} GiB, "
         f"{props.multi_processor_count} SMs, torch {torch.__version__}, CUDA {torch.version.cuda}")
    figures: dict[str, Any] = {"host": host, "device": name, "torch": torch.__version__}
    emit(f"matmul {matmul_n}x{matmul_n} (dense TFLOP/s):")
    for kind in ("fp32", "tf32", "bf16"):
        tflops = _matmul(matmul_n, kind)
        figures[f"matmul_{kind}_tflops"] = tflops
        emit(_line(kind + (" (TF32 off)" if kind == "fp32" else ""), tflops, "TFLOP/s", peaks.get(kind)))
    bw = _copy_bw(copy_bytes)
    figures.update({f"{k}_GBps": v for k, v in bw.items()})
    emit(f"memory copies of {copy_bytes / 2**20:.0f} MiB (GB/s, 1e9 B/s):")
    emit(_line("device-to-device (read + write)", bw["d2d"], "GB/s", peaks.get("mem")))
    emit(_line("host-to-device (pinned)", bw["h2d"], "GB/s", None))
    emit(_line("device-to-host (pinned)", bw["d2h"], "GB/s", None))
    ln = _layernorm()
    figures.update({f"layernorm_{k}": v for k, v in ln.items()})
    emit("LayerNorm 8192 x 4096:")
    for dt in ("fp32", "bf16"):
        emit(f"  {dt}: forward {ln[dt + '_fwd_ms']:.3f} ms ({ln[dt + '_fwd_GBps']:.0f} GB/s moved), "
             f"forward+backward {ln[dt + '_fwd_bwd_ms']:.3f} ms")
    if json_path:
        with open(json_path, "w") as fh:
            json.dump(figures, fh, indent=1)
        emit(f"# JSON written to {json_path}")
    return 0
