"""``torchhpc doctor --gpu`` and the GPU benchmark harness, on this GPU-less machine.

The measuring parts need a GPU and run on one (docs/training.md); here: the
thresholds and reference figures, the real command on CPU (says no GPU is
visible, exits 0), the NCCL check's failure path with a real launch (NCCL
cannot start on CPU, and the check must report that, not crash), and
benchmarks/gpu_training.py's no-GPU exit and its Markdown from a canned result,
and the device script benchmarks/gpu_proof.sh (shellcheck, and its failure cases'
no-GPU exit: the cases themselves ran on an H200), and benchmarks/gpu_checkpoint.py's no-GPU exit and
its comparison (its runs on CUDA passed on the H200, docs/training.md).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from tests.conftest import PYTHON, REPO, missing
from torchhpc.bench.gpu import expected_figure, known_peak
from torchhpc.doctor.gpu import PASS_SHARE, WARN_SHARE, check_nccl, judge


def test_reference_figures() -> None:
    assert expected_figure("NVIDIA H100 80GB HBM3", "bf16") == (800.0, "a healthy H100")  # measured, not the 989 datasheet
    assert expected_figure("NVIDIA H100 80GB HBM3", "resnet50_img_s") == (3719.0, "a healthy H100")
    pcie = expected_figure("NVIDIA H100 PCIe", "bf16")  # never the SXM measurement
    assert pcie is not None and pcie[0] == pytest.approx(756.0 * 0.78) and "datasheet" in pcie[1]
    assert expected_figure("NVIDIA GH200 480GB", "mem") == (pytest.approx(4000.0 * 0.88), "0.88 of the GH200 datasheet")
    assert expected_figure("Tesla T4", "bf16") is None and known_peak("Tesla T4") == {}
    assert expected_figure("NVIDIA A100-SXM4-80GB", "resnet50_img_s") is None


def test_judge_thresholds() -> None:
    ref = (800.0, "a healthy H100")
    healthy = judge("matmul GPU0", 799.8, "TFLOP/s", ref, "bf16 matmul")
    assert healthy.status == "pass" and "1.00 of a healthy H100 (800)" in healthy.detail
    assert judge("m", 800 * PASS_SHARE, "TFLOP/s", ref, "x").status == "pass"
    slow = judge("m", 800 * (PASS_SHARE - 0.01), "TFLOP/s", ref, "x")
    assert slow.status == "warn" and slow.hint and "nvidia-smi" in slow.hint
    assert judge("m", 800 * (WARN_SHARE - 0.01), "TFLOP/s", ref, "x").status == "fail"
    assert judge("m", float("nan"), "TFLOP/s", ref, "x").status == "fail"
    unknown = judge("m", 123.4, "TFLOP/s", None, "x")
    assert unknown.status == "skip" and "123.4 TFLOP/s" in unknown.detail


def test_doctor_gpu_on_cpu_says_so_and_passes() -> None:
    cp = subprocess.run([PYTHON, "-m", "torchhpc", "doctor", "--gpu"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "No GPU visible on" in cp.stdout and "Nothing to check." in cp.stdout
    js = subprocess.run([PYTHON, "-m", "torchhpc", "doctor", "--gpu", "--json"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert js.returncode == 0 and json.loads(js.stdout)["checks"] == [] and "No GPU visible" in js.stderr


def test_nccl_check_reports_a_failed_launch() -> None:
    c = check_nccl(1, python=sys.executable, timeout=120)
    assert c.status == "fail" and c.hint, c
    assert "all_reduce over 1 GPU failed" in c.detail and "nccl" in c.detail.lower(), c.detail


@pytest.mark.parametrize("case", ["oom", "thd"])
def test_gpu_failure_cases_without_gpu_provoke_nothing(case: str) -> None:
    cp = subprocess.run([PYTHON, str(REPO / "benchmarks" / "gpu_failures.py"), case], capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0 and f"case {case} provokes a GPU failure and has nothing to provoke here" in cp.stdout, cp.stdout + cp.stderr


def test_gpu_proof_script_is_clean_shell() -> None:
    if shutil.which("shellcheck") is None:
        missing("shellcheck not installed (scripts/test.sh installs it)")
    script = str(REPO / "benchmarks" / "gpu_proof.sh")
    cp = subprocess.run(["shellcheck", script], capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, cp.stdout
    usage = subprocess.run(["bash", script], capture_output=True, text=True, timeout=60)
    assert usage.returncode != 0 and "usage: benchmarks/gpu_proof.sh OUTDIR" in usage.stderr, usage.stderr


def test_gpu_checkpoint_check_without_gpu_and_its_comparison() -> None:
    import torch

    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        from gpu_checkpoint import differences
    finally:
        sys.path.pop(0)
    a = {"model": {"w": torch.ones(2)}, "optim": {"state": {0: {"step": torch.tensor(3.0)}}, "param_groups": [{"lr": 0.1}]}}
    b = {"model": {"w": torch.ones(2)}, "optim": {"state": {0: {"step": torch.tensor(3.0)}}, "param_groups": [{"lr": 0.1}]}}
    assert differences(a, b) == []
    b["model"]["w"] = torch.tensor([1.0, 1.0 + 1e-7])
    b["optim"]["param_groups"][0]["lr"] = 0.2
    assert differences(a, b, "x") == ["x/model/w", "x/optim/param_groups[0]/lr"]
    assert differences({"w": torch.ones(2)}, {"w": torch.ones(2, dtype=torch.float64)}) == ["/w"]
    cp = subprocess.run([PYTHON, str(REPO / "benchmarks" / "gpu_checkpoint.py")], capture_output=True, text=True, timeout=120)
    assert cp.returncode == 2 and cp.stderr.startswith("Error: no CUDA GPU here\nHINT: "), cp.stdout + cp.stderr


def test_gpu_training_benchmark_without_gpu() -> None:
    cp = subprocess.run([PYTHON, str(REPO / "benchmarks" / "gpu_training.py")], capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0 and "No GPU visible" in cp.stdout, cp.stdout + cp.stderr


def test_gpu_training_markdown() -> None:
    sys.path.insert(0, str(REPO / "benchmarks"))
    import gpu_training

    stats = {"median": 3700.0, "min": 3650.0, "max": 3720.0}
    res = {
        "device_name": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130", "date": "2026-11-23",
        "resnet": {"arch": "resnet50", "image_size": 224, "batch_size": 128, "precision": "bf16 autocast",
                   "channels_last": True, "example_model": "torchvision 0.26.0", "reference_model": "torchvision 0.26.0",
                   "img_per_s": {"example": stats, "reference": {**stats, "median": 3719.0}},
                   "ratio": 3700 / 3719, "ratio_per_round": {"median": 0.99, "min": 0.98, "max": 1.0},
                   "peak_memory_gib": {"example": 6.5, "reference": 5.7}, "example_dataset_gib": 0.72,
                   "rounds": 7, "steps_per_round": 20, "example_data_path_ms": 0.14,
                   "profile": {"example": {"wall_ms_per_step": 35.5, "device_ms_per_step": 28.9},
                               "reference": {"wall_ms_per_step": 34.0, "device_ms_per_step": 28.7}}},
        "mnist": {"steps": 100, "batch_size": 64, "in_memory_over_dataloader": 2.5,
                  "samples_per_s": {"in-memory tensor": {"median": 50000.0, "min": 0.5, "max": 60000.0},
                                    "DataLoader": {"median": 20000.0, "min": 19000.0, "max": 21000.0}}},
    }
    md = gpu_training.markdown(res)
    assert "| examples/resnet_ddp.py step | torchvision 0.26.0 | 3700 | 3650–3720 | 6.50 |" in md
    assert "| reference loop | torchvision 0.26.0 | 3719 |" in md
    assert "Example ÷ reference: **0.995**" in md and "| in-memory tensor | 50000 | 0.5–60000 |" in md
    assert "Note:" not in md
    assert "data path alone (index_select + channels_last copy): 0.14 ms" in md
    assert "wall / kernels): example 35.50 / 28.90; reference 34.00 / 28.70" in md
