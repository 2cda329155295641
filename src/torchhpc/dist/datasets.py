"""Offline training data: an MNIST IDX reader and a built-in 28×28 digits set.

Why both: the LUMI guide's MNIST demo breaks when every rank downloads from the same
web server (throttling), and compute nodes often have no internet at all. So the
examples read real MNIST from a prepared directory when one is given (IDX files,
``.gz`` or not, the layout torchvision and ``wget`` leave behind), and otherwise
build a deterministic, learnable digits set from stroke templates that ship in
this module — no download, no extra package, identical bytes on every machine.

Everything returns whole-dataset tensors (``uint8`` images ``N×28×28``, ``int64``
labels): the fast training path slices batches from one in-memory tensor
instead of running per-sample Python transforms.
"""

from __future__ import annotations

import gzip
import hashlib
import math
import os
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchhpc.errors import UsageError

if TYPE_CHECKING:
    import torch

__all__ = [
    "MNIST_FILES",
    "Digits",
    "builtin_digits",
    "default_cache_dir",
    "find_mnist",
    "load_mnist",
    "read_idx",
    "render_digits",
]

# IDX element types (first bytes of the magic number), after LeCun's format page.
_IDX_TYPES: dict[int, tuple[str, int]] = {
    0x08: ("uint8", 1),
    0x09: ("int8", 1),
    0x0B: ("int16", 2),
    0x0C: ("int32", 4),
    0x0D: ("float32", 4),
    0x0E: ("float64", 8),
}

MNIST_FILES: dict[str, tuple[str, str]] = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}

# Bump when the generator changes: it is part of the cache file name.
_GENERATOR_VERSION = 2


@dataclass(frozen=True)
class Digits:
    """A train/test split held as whole tensors (images uint8 N×28×28, labels int64 N)."""

    train_images: torch.Tensor
    train_labels: torch.Tensor
    test_images: torch.Tensor
    test_labels: torch.Tensor
    source: str

    def normalized(self, device: Any = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Float N×1×28×28 images scaled like torchvision's MNIST normalisation, on ``device``."""
        mean, std = 0.1307, 0.3081

        def f(x: torch.Tensor) -> torch.Tensor:
            return ((x.float() / 255.0 - mean) / std).unsqueeze(1).to(device)

        return (
            f(self.train_images),
            self.train_labels.to(device),
            f(self.test_images),
            self.test_labels.to(device),
        )


# --------------------------------------------------------------------------- IDX


def read_idx(path: str | os.PathLike[str]) -> torch.Tensor:
    """Read one IDX file (optionally gzip-compressed) into a tensor of its shape and type."""
    import numpy as np
    import torch

    p = Path(path)
    opener = gzip.open if p.suffix == ".gz" else open
    with opener(p, "rb") as fh:
        data = fh.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise UsageError(
            f"{p} is not an IDX file (magic {data[:4].hex() or 'empty'})",
            hint="pass the directory holding train-images-idx3-ubyte[.gz] etc. as downloaded from the MNIST site",
        )
    kind, ndim = data[2], data[3]
    if kind not in _IDX_TYPES:
        raise UsageError(f"{p}: unknown IDX element type 0x{kind:02x}", hint="expected one of 0x08-0x0e")
    dtype, size = _IDX_TYPES[kind]
    dims = struct.unpack(f">{ndim}i", data[4 : 4 + 4 * ndim])
    offset = 4 + 4 * ndim
    count = math.prod(dims)
    if len(data) - offset != count * size:
        raise UsageError(
            f"{p}: header says {dims} ({count * size} bytes) but the file holds {len(data) - offset}",
            hint="the download is truncated; fetch it again",
        )
    arr = np.frombuffer(data, dtype=np.dtype(dtype).newbyteorder(">"), offset=offset).astype(dtype)
    return torch.from_numpy(arr.reshape(dims).copy())


def find_mnist(root: str | os.PathLike[str]) -> dict[str, Path]:
    """Locate the four MNIST files under ``root`` (also ``root/MNIST/raw``), ``.gz`` or not."""
    base = Path(root)
    found: dict[str, Path] = {}
    for folder in (base, base / "MNIST" / "raw", base / "raw"):
        for split, names in MNIST_FILES.items():
            for i, name in enumerate(names):
                key = f"{split}_{'images' if i == 0 else 'labels'}"
                if key in found:
                    continue
                for cand in (folder / name, folder / f"{name}.gz"):
                    if cand.is_file():
                        found[key] = cand
                        break
    missing = [k for k in ("train_images", "train_labels", "test_images", "test_labels") if k not in found]
    if missing:
        raise UsageError(
            f"--data {str(base)!r}: MNIST files missing: {', '.join(missing)}",
            hint="expected train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz], "
            "t10k-images-idx3-ubyte[.gz], t10k-labels-idx1-ubyte[.gz] (also under MNIST/raw/); "
            "or leave --data out to use the built-in digits",
        )
    return found


def load_mnist(root: str | os.PathLike[str]) -> Digits:
    """Real MNIST from a directory of IDX files."""
    import torch

    files = find_mnist(root)
    parts = {k: read_idx(v) for k, v in files.items()}
    for split in ("train", "test"):
        n_img, n_lab = parts[f"{split}_images"].shape[0], parts[f"{split}_labels"].shape[0]
        if n_img != n_lab:
            raise UsageError(
                f"{files[f'{split}_images']}: {n_img} images but {n_lab} labels",
                hint="the image and label files come from different downloads",
            )
    return Digits(
        parts["train_images"].to(torch.uint8),
        parts["train_labels"].to(torch.int64),
        parts["test_images"].to(torch.uint8),
        parts["test_labels"].to(torch.int64),
        source=f"mnist:{Path(root)}",
    )


# ---------------------------------------------------------------- built-in digits


def _arc(cx: float, cy: float, rx: float, ry: float, a0: float, a1: float, n: int = 10) -> list[tuple[float, float]]:
    """Points on an elliptic arc; angles in degrees, 0 = right, 90 = down (image y grows down)."""
    return [
        (cx + rx * math.cos(math.radians(a0 + (a1 - a0) * i / n)), cy + ry * math.sin(math.radians(a0 + (a1 - a0) * i / n)))
        for i in range(n + 1)
    ]


# Each digit is a list of polylines in a unit box (x right, y down), shaped like
# handwriting rather than a seven-segment display so a CNN has to learn curves.
_TEMPLATES: dict[int, list[list[tuple[float, float]]]] = {
    0: [_arc(0.5, 0.5, 0.28, 0.4, 0, 360, 20)],
    1: [[(0.35, 0.25), (0.55, 0.1), (0.55, 0.9)]],
    2: [[*_arc(0.5, 0.32, 0.28, 0.22, 190, 380, 10), (0.2, 0.9), (0.82, 0.9)]],
    3: [_arc(0.48, 0.3, 0.26, 0.2, 200, 450, 10), _arc(0.48, 0.69, 0.3, 0.21, 270, 520, 10)],
    4: [[(0.62, 0.9), (0.62, 0.1), (0.15, 0.64), (0.85, 0.64)]],
    5: [[(0.78, 0.1), (0.3, 0.1), (0.26, 0.45)], _arc(0.48, 0.64, 0.3, 0.25, 230, 490, 12)],
    6: [_arc(0.62, 0.45, 0.38, 0.36, 250, 180, 6) + _arc(0.5, 0.67, 0.26, 0.23, 180, 540, 16)],
    7: [[(0.18, 0.12), (0.82, 0.12), (0.42, 0.9)], [(0.35, 0.52), (0.72, 0.52)]],
    8: [_arc(0.5, 0.3, 0.22, 0.2, 0, 360, 16), _arc(0.5, 0.7, 0.27, 0.21, 0, 360, 16)],
    9: [_arc(0.48, 0.33, 0.25, 0.22, 0, 360, 16), [(0.73, 0.33), (0.66, 0.9)]],
}


def _segments(digit: int) -> list[tuple[float, float, float, float]]:
    return [(x0, y0, x1, y1) for line in _TEMPLATES[digit] for (x0, y0), (x1, y1) in zip(line[:-1], line[1:])]


def render_digits(n: int, seed: int, size: int = 28) -> tuple[torch.Tensor, torch.Tensor]:
    """Render ``n`` jittered handwritten-style digits (uint8 n×size×size) and their labels.

    Deterministic for a given ``(n, seed)``: every rank and every machine builds the
    same bytes. Variation per sample: per-point wobble, rotation, shear, anisotropic
    scale, translation, stroke width, intensity, a stray stroke on a third of the
    samples and background noise — learnable, but not trivially (a CNN needs a few
    thousand steps to pass 99%).
    """
    import torch

    g = torch.Generator().manual_seed(seed)
    tables = [torch.tensor(_segments(d), dtype=torch.float32) for d in range(10)]
    smax = max(t.shape[0] for t in tables)
    # Pad each digit's segment table to smax with copies of its first segment (harmless).
    seg = torch.stack([torch.cat([t, t[:1].expand(smax - t.shape[0], 4)]) for t in tables])  # 10×S×4

    labels = torch.randint(0, 10, (n,), generator=g)
    out = torch.empty(n, size, size, dtype=torch.uint8)
    ys, xs = torch.meshgrid(torch.arange(size, dtype=torch.float32), torch.arange(size, dtype=torch.float32), indexing="ij")
    pix = torch.stack([xs.flatten(), ys.flatten()], dim=1) + 0.5  # P×2, pixel centres

    chunk = 256
    for start in range(0, n, chunk):
        lab = labels[start : start + chunk]
        b = lab.shape[0]
        s = seg[lab].clone()  # b×S×4 in unit coordinates
        # Wobble each endpoint a little (consistent across a segment chain is not needed at this scale).
        s += (torch.rand(b, smax, 4, generator=g) - 0.5) * 0.1
        pts = s.view(b, smax * 2, 2) - 0.5
        ang = (torch.rand(b, generator=g) - 0.5) * math.radians(44)
        shear = (torch.rand(b, generator=g) - 0.5) * 0.6
        sx = 0.75 + torch.rand(b, generator=g) * 0.3
        sy = 0.8 + torch.rand(b, generator=g) * 0.25
        cos, sin = torch.cos(ang), torch.sin(ang)
        # A = R · Shear · Scale, applied to centred points, then scaled to a 20×20 box like MNIST.
        a11, a12 = cos * sx, (cos * shear - sin) * sy
        a21, a22 = sin * sx, (sin * shear + cos) * sy
        x, y = pts[..., 0], pts[..., 1]
        box = 20.0
        tx = size / 2 + (torch.rand(b, generator=g) - 0.5) * 4
        ty = size / 2 + (torch.rand(b, generator=g) - 0.5) * 4
        px = (a11[:, None] * x + a12[:, None] * y) * box + tx[:, None]
        py = (a21[:, None] * x + a22[:, None] * y) * box + ty[:, None]
        p = torch.stack([px, py], dim=-1).view(b, smax, 2, 2)
        # A stray pen stroke on a third of the samples (kept off-canvas on the rest).
        q0 = 3 + torch.rand(b, 1, 2, generator=g) * (size - 6)
        q1 = q0 + (torch.rand(b, 1, 2, generator=g) - 0.5) * 12
        stray = torch.rand(b, 1, 1, generator=g) < 0.33
        q0 = torch.where(stray, q0, torch.full_like(q0, -100.0))
        q1 = torch.where(stray, q1, torch.full_like(q1, -100.0))
        p = torch.cat([p, torch.stack([q0, q1], dim=2)], dim=1)
        p0, p1 = p[:, :, 0], p[:, :, 1]  # b×(S+1)×2
        # Distance from every pixel centre to every segment (b×S×P), x and y kept apart
        # so every op is a plain broadcast over contiguous b×S×P buffers.
        x0, y0 = p0[..., 0, None], p0[..., 1, None]
        dx, dy = p1[..., 0, None] - x0, p1[..., 1, None] - y0
        rx, ry = pix[:, 0] - x0, pix[:, 1] - y0
        t = ((rx * dx + ry * dy) / (dx * dx + dy * dy).clamp_min(1e-6)).clamp_(0, 1)
        rx.sub_(t * dx)
        ry.sub_(t * dy)
        dist = (rx.square_() + ry.square_()).amin(dim=1).sqrt_()  # b×P
        width = 0.9 + torch.rand(b, 1, generator=g) * 1.1
        ink = (width + 0.7 - dist).clamp(0, 1) * (0.75 + torch.rand(b, 1, generator=g) * 0.25)
        ink = ink + torch.rand(b, size * size, generator=g) * 0.2
        out[start : start + b] = (ink.clamp(0, 1) * 255).round().to(torch.uint8).view(b, size, size)
    return out, labels.to(torch.int64)


def default_cache_dir() -> Path:
    """``$TORCHHPC_CACHE`` or ``$XDG_CACHE_HOME/torchhpc`` or ``~/.cache/torchhpc``."""
    if os.environ.get("TORCHHPC_CACHE"):
        return Path(os.environ["TORCHHPC_CACHE"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "torchhpc"


def builtin_digits(
    train_size: int = 10000,
    test_size: int = 2000,
    seed: int = 0,
    cache_dir: str | os.PathLike[str] | None = None,
) -> Digits:
    """The built-in digits, generated once and cached as one ``.pt`` file.

    Call it inside ``main_first()``: the first rank renders and writes the cache
    (atomically, so a reader never sees half a file), the others then load it.
    ``cache_dir=""`` disables the cache (every caller renders).
    """
    import torch

    if train_size <= 0 or test_size <= 0:
        raise UsageError(
            f"built-in digits need positive sizes, got train={train_size} test={test_size}",
            hint="pass e.g. --train-size 10000 --test-size 2000",
        )
    key = hashlib.sha256(f"v{_GENERATOR_VERSION}:{train_size}:{test_size}:{seed}".encode()).hexdigest()[:12]
    path = None
    if cache_dir != "":
        folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        path = folder / f"digits-{train_size}-{test_size}-{seed}-{key}.pt"
        if path.is_file():
            tr_x, tr_y, te_x, te_y = torch.load(path, weights_only=True)["tensors"]
            return Digits(tr_x, tr_y, te_x, te_y, source=f"builtin:{path}")
    tr_x, tr_y = render_digits(train_size, seed=seed * 2 + 1)
    te_x, te_y = render_digits(test_size, seed=seed * 2 + 2)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
        os.close(fd)
        try:
            torch.save({"tensors": [tr_x, tr_y, te_x, te_y]}, tmp)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return Digits(tr_x, tr_y, te_x, te_y, source=f"builtin:{path or 'uncached'}")
