"""Models shared by the examples and benchmarks.

ResNets come the way users have them: torchvision's when torchvision imports
(NGC images and most GPU venvs ship it; ``pip install torchhpc[vision]`` with
torch constrained), else the same layout written out here in plain torch.nn
(BasicBlock / Bottleneck, stages 64-128-256-512): a torchvision wheel built for
another torch refuses to import, and CI has none. Either way the stem follows
the input: the ImageNet stem (7×7 stride-2 conv + max-pool) from 64 px up, a
3×3 stride-1 stem without max-pool below (28×28 digits, 32×32 CIFAR), where
the ImageNet stem would shrink the image to a few pixels before the first
stage. See :func:`build_resnet`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from torchhpc.errors import UsageError


class MnistCNN(nn.Module):
    """The classic PyTorch-examples MNIST network (two convs, dropout, two FC layers)."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        return self.fc2(x)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = _shortcut(inplanes, planes * self.expansion, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * self.expansion, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.shortcut = _shortcut(inplanes, planes * self.expansion, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return F.relu(out + self.shortcut(x))


def _shortcut(inplanes: int, outplanes: int, stride: int) -> nn.Module:
    if stride == 1 and inplanes == outplanes:
        return nn.Identity()
    return nn.Sequential(nn.Conv2d(inplanes, outplanes, 1, stride, bias=False), nn.BatchNorm2d(outplanes))


class ResNet(nn.Module):
    """ResNet with the ImageNet stem, or a 3×3 stem without max-pool for small images."""

    def __init__(
        self,
        block: type[BasicBlock] | type[Bottleneck],
        layers: list[int],
        num_classes: int = 10,
        in_channels: int = 3,
        small_input: bool = True,
        width: int = 64,
    ) -> None:
        super().__init__()
        self.inplanes = width
        if small_input:
            self.stem = nn.Sequential(
                nn.Conv2d(in_channels, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True)
            )
        else:
            self.stem = nn.Sequential(
                nn.Conv2d(in_channels, width, 7, 2, 3, bias=False),
                nn.BatchNorm2d(width),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(3, 2, 1),
            )
        stages = []
        for i, n in enumerate(layers):
            stages.append(self._stage(block, width * 2**i, n, stride=1 if i == 0 else 2))
        self.layers = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(self.inplanes, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def _stage(self, block: type[BasicBlock] | type[Bottleneck], planes: int, n: int, stride: int) -> nn.Sequential:
        blocks: list[nn.Module] = []
        for i in range(n):
            blocks.append(block(self.inplanes, planes, stride if i == 0 else 1))
            self.inplanes = planes * block.expansion
        return nn.Sequential(*blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(self.pool(x), 1))


def resnet18(**kw: object) -> ResNet:
    return ResNet(BasicBlock, [2, 2, 2, 2], **kw)  # type: ignore[arg-type]


def resnet50(**kw: object) -> ResNet:
    return ResNet(Bottleneck, [3, 4, 6, 3], **kw)  # type: ignore[arg-type]


ARCHS: dict[str, Callable[..., nn.Module]] = {"resnet18": resnet18, "resnet50": resnet50}


SMALL_STEM_BELOW = 64
"""Images smaller than this (in pixels per side) get the 3×3 stride-1 stem without max-pool."""

SOURCES = ("auto", "torchvision", "builtin")


def small_stem(image_size: int) -> bool:
    """True when an image of ``image_size`` pixels per side gets the small-input stem."""
    return image_size < SMALL_STEM_BELOW


def torchvision_models() -> tuple[Any, str] | tuple[None, str]:
    """``(torchvision.models, version)``, or ``(None, why not)``.

    Any exception counts as absent: a torchvision built for another torch
    raises RuntimeError or OSError from its C++ ops, not ImportError.
    """
    try:
        import torchvision
        import torchvision.models as tvm
    except Exception as e:
        return None, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".rstrip(": ")
    return tvm, str(getattr(torchvision, "__version__", "?"))


def build_resnet(
    arch: str, *, image_size: int, num_classes: int = 10, in_channels: int = 3, source: str = "auto"
) -> tuple[nn.Module, str]:
    """The ResNet for ``image_size``-pixel inputs and where it came from (``"torchvision 0.26.0"`` / ``"builtin"``).

    ``source``: ``auto`` (torchvision if it imports), ``torchvision`` (required)
    or ``builtin``. torchvision's model keeps its ImageNet stem from 64 px up;
    below, or with other than 3 input channels, its ``conv1``/``maxpool`` are
    replaced the way CIFAR recipes do.
    """
    if arch not in ARCHS:
        raise UsageError(f"--arch {arch!r} is not one of {', '.join(sorted(ARCHS))}", hint="use resnet18 or resnet50")
    if source not in SOURCES:
        raise UsageError(f"--model-source {source!r} is not one of {', '.join(SOURCES)}", hint="leave it at auto")
    small = small_stem(image_size)
    if source != "builtin":
        tvm, version = torchvision_models()
        if tvm is not None:
            net: nn.Module = getattr(tvm, arch)(weights=None, num_classes=num_classes)
            if small:
                net.conv1 = nn.Conv2d(in_channels, 64, 3, 1, 1, bias=False)
                net.maxpool = nn.Identity()
            elif in_channels != 3:
                net.conv1 = nn.Conv2d(in_channels, 64, 7, 2, 3, bias=False)
            return net, f"torchvision {version}"
        if source == "torchvision":
            raise UsageError(
                f"--model-source torchvision but torchvision does not import ({version})",
                hint="install the torchvision built for this torch (torchhpc[vision] with torch constrained), "
                "or use --model-source auto to fall back to the built-in ResNet",
            )
    return ARCHS[arch](num_classes=num_classes, in_channels=in_channels, small_input=small), "builtin"


def describe_stem(image_size: int) -> str:
    return "small (3x3/1, no max-pool)" if small_stem(image_size) else "ImageNet (7x7/2 + max-pool)"
