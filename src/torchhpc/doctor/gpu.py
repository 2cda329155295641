"""``torchhpc doctor --gpu``: is this node's GPU work as fast as a healthy node's?

What a user runs on a fresh allocation and a site after maintenance. Per
visible GPU: a dense bf16 matmul and a device-to-device copy (the
measurements of ``torchhpc bench gpu``); over all visible GPUs: an NCCL
all_reduce through ``torchhpc run`` and the project's benchmark (correctness
and bus bandwidth); on GPU 0: a short ResNet-50 training step (torchvision's
where it imports, bf16 autocast, channels_last).

Each figure is judged against what a healthy card of the kind reaches
(:func:`torchhpc.bench.gpu.expected_figure`: measured where we have a
measurement, else a typical share of the datasheet): PASS from
:data:`PASS_SHARE` of it, WARN from :data:`WARN_SHARE`, FAIL below. A device
with no reference is measured and reported, not judged (skip). No GPU: it
says so and passes, like ``bench gpu``.

torch is imported in this process (unlike the other doctor checks, which
probe it in a child): measuring needs it, and a broken CUDA stack shows as
a failed check with its error.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

from torchhpc.core.units import counted
from torchhpc.doctor.base import Check

__all__ = ["PASS_SHARE", "WARN_SHARE", "gpu_checks", "judge"]

PASS_SHARE = 0.85
WARN_SHARE = 0.60
# all_reduce bus bandwidth (GB/s) under which GPUs of one node do not talk over NVLink/P2P at all.
MIN_BUSBW = 10.0

Emit = Callable[[str], None]


def judge(name: str, value: float, unit: str, expected: Optional[tuple[float, str]], what: str) -> Check:
    """PASS/WARN/FAIL of ``value`` against ``expected`` = (figure, where it comes from); skip without one."""
    if not math.isfinite(value) or value <= 0:
        return Check(name, "fail", f"{what}: measured {value} {unit}", "the device did not compute: see `nvidia-smi`")
    if expected is None:
        return Check(name, "skip", f"{what}: {value:.1f} {unit}; no reference figure for this device, not judged")
    ref, source = expected
    share = value / ref
    detail = f"{what}: {value:.1f} {unit} = {share:.2f} of {source} ({ref:.0f})"
    if share >= PASS_SHARE:
        return Check(name, "pass", detail)
    hint = ("a slow GPU: check clocks, power and temperature (`nvidia-smi -q -d CLOCK,POWER,TEMPERATURE,PERFORMANCE`), "
            "and that nothing else runs on it (`nvidia-smi`)")
    return Check(name, "warn" if share >= WARN_SHARE else "fail", detail + f", under {PASS_SHARE:.2f}", hint)


def _per_device(index: int, name: str) -> list[Check]:
    import torch

    from torchhpc.bench.gpu import _copy_bw, _matmul, expected_figure

    with torch.cuda.device(index):
        tflops = _matmul(8192, "bf16")
        copy = _copy_bw(1 << 30)["d2d"]
    label = f"GPU{index}"
    return [
        judge(f"matmul {label}", tflops, "TFLOP/s", expected_figure(name, "bf16"), f"bf16 8192³ matmul on {name}"),
        judge(f"copy {label}", copy, "GB/s", expected_figure(name, "mem"), "device-to-device copy (read + write)"),
    ]


def check_nccl(count: int, python: str = sys.executable, timeout: float = 300) -> Check:
    """An NCCL all_reduce over ``count`` GPUs: one rank per GPU under ``torchhpc run``, 1 MiB to 256 MiB."""
    out = Path(tempfile.mkdtemp(prefix="torchhpc-doctor-")) / "all_reduce.json"
    argv = [python, "-m", "torchhpc", "run", "-n", str(count), "-m", "torchhpc.bench", "all_reduce",
            "-b", "1M", "-e", "256M", "-f", "16", "-n", "20", "-w", "5", "--json", str(out)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHHPC_")}
    env["TORCHHPC_BACKEND"] = "nccl"
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return Check("nccl", "fail", f"all_reduce over {counted(count, 'GPU')} did not finish in {timeout:.0f} s",
                     "NCCL hangs: run with NCCL_DEBUG=INFO and see `torchhpc net check`")
    if done.returncode != 0 or not out.is_file():
        lines = [re.sub(r"^(\[rank\d+\]:\s*)+", "", ln) for ln in (done.stderr + done.stdout).splitlines()]
        why = next((ln for ln in lines if "Error" in ln), lines[-1] if lines else "no output")
        return Check("nccl", "fail", f"all_reduce over {counted(count, 'GPU')} failed (exit {done.returncode}): {why[:300]}",
                     "rerun with NCCL_DEBUG=INFO: `torchhpc run -n N -m torchhpc.bench all_reduce`")
    data = json.loads(out.read_text())
    rows = data["results"][0]["rows"]
    last = rows[-1]["out_of_place"] or rows[-1]["in_place"]
    size = rows[-1]["size"] / 2**20
    if data.get("wrong"):
        return Check("nccl", "fail", f"all_reduce over {counted(count, 'GPU')}: {counted(data['wrong'], 'wrong value')}",
                     "a GPU or link corrupts data: take the node out of service")
    if count == 1:
        return Check("nccl", "pass", f"NCCL all_reduce on 1 GPU correct ({last['time_us']:.0f} us at {size:.0f} MiB); "
                     "one rank moves no data between GPUs, so there is no bandwidth to judge")
    detail = f"NCCL all_reduce over {count} GPUs correct; busbw {last['busbw']:.1f} GB/s at {size:.0f} MiB"
    if last["busbw"] < MIN_BUSBW:
        return Check("nccl", "warn", detail + f", under {MIN_BUSBW:.0f} GB/s",
                     "GPUs of this node do not use NVLink/P2P: check `nvidia-smi topo -m` and NCCL_P2P_DISABLE")
    return Check("nccl", "pass", detail)


def check_training(name: str, batch: int = 128, steps: int = 10) -> Check:
    """A few ResNet-50 training steps at 224 px (bf16 autocast, channels_last, SGD) on the current GPU."""
    import torch
    import torch.nn.functional as F

    from torchhpc.bench.gpu import expected_figure

    try:
        import torchvision

        model = torchvision.models.resnet50(weights=None)
        origin = f"torchvision {torchvision.__version__} ResNet-50"
    except Exception:  # absent, or built for another torch: a plain conv stack still exercises cuDNN
        model = _plain_convnet()
        origin = "a plain conv net (torchvision does not import)"
    dev = torch.device("cuda", torch.cuda.current_device())
    old = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    try:
        model = model.to(dev, memory_format=torch.channels_last).train()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        x = torch.randn(batch, 3, 224, 224, device=dev).contiguous(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (batch,), device=dev)

        def step() -> torch.Tensor:
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss.detach()

        for _ in range(5):
            step()
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        for _ in range(steps):
            loss = step()
        torch.cuda.synchronize(dev)
        img_s = batch * steps / (time.perf_counter() - t0)
    finally:
        torch.backends.cudnn.benchmark = old
    if not math.isfinite(float(loss)):
        return Check("training", "fail", f"{origin}: loss {float(loss)}", "non-finite loss on random data: a broken GPU or library")
    what = f"{origin} training step, 224 px, batch {batch}, bf16"
    expected = expected_figure(name, "resnet50_img_s") if origin.startswith("torchvision") else None
    return judge("training", img_s, "img/s", expected, what)


def _plain_convnet() -> Any:
    from torch import nn

    layers: list[nn.Module] = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    width = 64
    for _ in range(4):
        layers += [nn.Conv2d(width, width * 2, 3, 2, 1, bias=False), nn.BatchNorm2d(width * 2), nn.ReLU()]
        width *= 2
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, 1000))


def gpu_checks(emit: Emit = print) -> list[Check]:
    """Measure every visible GPU; an empty list (after saying so through ``emit``) when there is none."""
    try:
        import torch
    except ImportError as e:
        emit(f"No GPU check on {socket.gethostname()}: torch does not import ({e}).")
        return []
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        emit(f"No GPU visible on {socket.gethostname()}: torch {torch.__version__} sees no CUDA/ROCm device "
             f"(CUDA build: {torch.version.cuda or 'none'}; CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}). "
             "Nothing to check.")
        emit("Run it where the GPUs are, e.g. `srun -N1 --gpus-per-node 4 torchhpc doctor --gpu`.")
        return []
    count = torch.cuda.device_count()
    names = [torch.cuda.get_device_name(i) for i in range(count)]
    emit(f"# torchhpc doctor --gpu on {socket.gethostname()}: {counted(count, 'GPU')} ({', '.join(sorted(set(names)))}), "
         f"torch {torch.__version__}, CUDA {torch.version.cuda}")
    checks: list[Check] = []
    for i, name in enumerate(names):
        checks += _guard(f"GPU{i}", functools.partial(_per_device, i, name))
    checks += _guard("nccl", lambda: [check_nccl(count)])
    checks += _guard("training", lambda: [check_training(names[0])])
    return checks


def _guard(name: str, fn: Callable[[], list[Check]]) -> list[Check]:
    try:
        return fn()
    except Exception as e:  # a doctor reports, it does not crash
        return [Check(name, "fail", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300],
                      "see `nvidia-smi` and the driver's kernel log")]
