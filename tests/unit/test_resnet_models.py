"""The ResNet example's model choice and defaults, on CPU.

torchvision cannot be installed beside this torch (PyPI's wheel does not
import beside torch 2.13 CPU), so its presence is FAKED in two tests: a
module object named ``torchvision`` whose ``models.resnet50`` returns the
built-in ResNet dressed with torchvision's attribute names (``conv1``,
``maxpool``), which is all the stem replacement touches. Its absence is
real here, and also forced with ``sys.modules['torchvision'] = None``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import types
from collections.abc import Iterator

import pytest

from tests.conftest import PYTHON, REPO, need

torch = need("torch")
from torch import nn  # noqa: E402

sys.path.insert(0, str(REPO / "examples"))
import models  # noqa: E402
import resnet_ddp  # noqa: E402

from torchhpc.errors import UsageError  # noqa: E402


def _stem(net: nn.Module) -> tuple[nn.Conv2d, bool]:
    conv = next(m for m in net.modules() if isinstance(m, nn.Conv2d))
    return conv, any(isinstance(m, nn.MaxPool2d) for m in net.modules())


@pytest.fixture
def no_torchvision(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torchvision", None)
    monkeypatch.setitem(sys.modules, "torchvision.models", None)


def test_stem_follows_the_image_size(no_torchvision: None) -> None:
    assert models.small_stem(28) and models.small_stem(63) and not models.small_stem(64) and not models.small_stem(224)
    big, origin = models.build_resnet("resnet18", image_size=224)
    assert origin == "builtin"
    conv, pool = _stem(big)
    assert (conv.kernel_size, conv.stride, pool) == ((7, 7), (2, 2), True)
    small, _ = models.build_resnet("resnet50", image_size=32)  # Bottleneck layout too
    conv, pool = _stem(small)
    assert (conv.kernel_size, conv.stride, pool) == ((3, 3), (1, 1), False)
    digits, _ = models.build_resnet("resnet18", image_size=28, in_channels=1)
    assert _stem(digits)[0].in_channels == 1
    net, _ = models.build_resnet("resnet18", image_size=64, num_classes=7)
    assert net(torch.randn(2, 3, 64, 64)).shape == (2, 7)  # the ImageNet stem at its smallest size


def test_sources_and_bad_names(no_torchvision: None) -> None:
    assert models.torchvision_models()[0] is None
    with pytest.raises(UsageError, match="--model-source torchvision but torchvision does not import"):
        models.build_resnet("resnet50", image_size=224, source="torchvision")
    with pytest.raises(UsageError, match="--arch 'resnet7'"):
        models.build_resnet("resnet7", image_size=224)
    with pytest.raises(UsageError, match="--model-source 'hub'"):
        models.build_resnet("resnet18", image_size=224, source="hub")


class _TvLike(nn.Module):
    """torchvision's attribute layout (conv1, maxpool), built from the built-in blocks."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.fc = nn.Linear(64, num_classes)


@pytest.fixture
def fake_torchvision(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, object]]]:
    """FAKE torchvision (see the module docstring); yields the keyword arguments of each model call."""
    calls: list[dict[str, object]] = []
    tv = types.ModuleType("torchvision")
    tvm = types.ModuleType("torchvision.models")

    def resnet50(**kw: object) -> nn.Module:
        calls.append(kw)
        return _TvLike(int(kw["num_classes"]))  # type: ignore[call-overload]

    tvm.resnet50 = resnet50  # type: ignore[attr-defined]
    tv.models = tvm  # type: ignore[attr-defined]
    tv.__version__ = "0.99.0"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torchvision", tv)
    monkeypatch.setitem(sys.modules, "torchvision.models", tvm)
    yield calls


def test_torchvision_is_used_when_it_imports(fake_torchvision: list[dict[str, object]]) -> None:
    net, origin = models.build_resnet("resnet50", image_size=224, num_classes=1000)
    assert origin == "torchvision 0.99.0" and fake_torchvision == [{"weights": None, "num_classes": 1000}]
    assert isinstance(net, _TvLike) and net.conv1.kernel_size == (7, 7) and isinstance(net.maxpool, nn.MaxPool2d)
    small, _ = models.build_resnet("resnet50", image_size=32)
    assert small.conv1.kernel_size == (3, 3) and small.conv1.stride == (1, 1) and isinstance(small.maxpool, nn.Identity)
    gray, _ = models.build_resnet("resnet50", image_size=224, in_channels=1)
    assert gray.conv1.in_channels == 1 and gray.conv1.kernel_size == (7, 7)
    _, origin = models.build_resnet("resnet18", image_size=224, source="builtin")
    assert origin == "builtin" and len(fake_torchvision) == 3


def _defaults(cuda: bool, *argv: str) -> argparse.Namespace:
    return resnet_ddp.resolve_defaults(resnet_ddp.parse_args(list(argv)), cuda)


def test_device_defaults() -> None:
    gpu = _defaults(True)
    assert (gpu.arch, gpu.image_size, gpu.batch_size, gpu.amp, gpu.channels_last, gpu.num_classes) == (
        "resnet50", 224, 128, True, True, 1000)
    cpu = _defaults(False)
    assert (cpu.arch, cpu.image_size, cpu.batch_size, cpu.amp, cpu.channels_last, cpu.num_classes) == (
        "resnet18", 32, 64, False, False, 10)
    mine = _defaults(True, "--arch", "resnet18", "--image-size", "96", "--no-amp", "--batch-size", "8")
    assert (mine.arch, mine.image_size, mine.batch_size, mine.amp, mine.channels_last) == ("resnet18", 96, 8, False, True)


def test_fewer_samples_than_a_batch_is_one_line_error() -> None:
    cp = subprocess.run([PYTHON, str(REPO / "examples" / "resnet_ddp.py"), "--mode", "single", "--samples", "64",
                         "--batch-size", "128", "--image-size", "16"], capture_output=True, text=True, timeout=300)
    assert cp.returncode != 0
    assert "Traceback" not in cp.stderr and "StopIteration" not in cp.stderr, cp.stderr
    assert cp.stderr.splitlines() == [
        "Error: --samples 64 gives 64 sample(s) per rank, fewer than one batch of --batch-size 128 (1 rank(s))",
        "HINT: use --samples 128 or more, or a smaller --batch-size",
    ], cp.stderr


@pytest.mark.parametrize("flag", ["--samples", "--image-size", "--epochs", "--batch-size", "--max-steps", "--num-classes"])
@pytest.mark.parametrize("value", ["-5", "0", "x"])
def test_sizes_are_positive_ints(flag: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A bad size is argparse's one-line error (exit 2), not `negative dimension` from inside torch."""
    with pytest.raises(SystemExit) as e:
        resnet_ddp.parse_args([flag, value])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"error: argument {flag}: " in err
    assert ("must be at least 1" if value != "x" else "is not an integer") in err


def test_size_flags_accept_good_values() -> None:
    args = resnet_ddp.parse_args(["--samples", "8", "--batch-size", "4", "--epochs", "1", "--warmup-steps", "0"])
    assert (args.samples, args.batch_size, args.epochs, args.warmup_steps) == (8, 4, 1, 0)
    with pytest.raises(SystemExit):
        resnet_ddp.parse_args(["--warmup-steps", "-1"])
