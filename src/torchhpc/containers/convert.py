"""Image conversion steps from seeds 000 and 001, as argv lists to print or run.

    docker save IMAGE -o X.tar  ->  apptainer build X.sif docker-archive://X.tar     (the MareNostrum5 guide)
    enroot import --output X.sqsh dockerd://IMAGE                                   (the GPU containers on Slurm guide)
    ch-convert -i docker IMAGE DIR                                                  (Charliecloud)

Podman (``--from podman``) saves a docker-archive the same way and is enroot's
``podman://`` source. Every step is a single command (no pipes), so the same list is
printed by the dry run and run one by one by :func:`run_steps`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

from torchhpc.core.proc import Runner
from torchhpc.errors import SpecError

TARGETS = ("sif", "sqsh", "dir")
SOURCES = ("docker", "podman")


def default_output(image: str, target: str) -> str:
    """``nvcr.io/nvidia/pytorch:24.03-py3`` -> ``pytorch-24.03-py3.sif`` (in the working directory)."""
    base = image.split("://", 1)[-1].rstrip("/").split("/")[-1]
    base = re.sub(r"[^A-Za-z0-9_.-]+", "-", base).strip("-.") or "image"
    return base if target == "dir" else f"{base}.{target}"


def steps(
    image: str,
    target: str = "sif",
    *,
    source: str = "docker",
    output: str | None = None,
    runtime: str = "apptainer",
    keep_tar: bool = False,
) -> list[list[str]]:
    """The commands that turn a local Docker/Podman image into a SIF, a squashfs or a directory."""
    if target not in TARGETS:
        raise SpecError(f"--to {target!r} is not a conversion target", f"choose one of: {', '.join(TARGETS)}")
    if source not in SOURCES:
        raise SpecError(f"--from {source!r} is not an image source", f"choose one of: {', '.join(SOURCES)}")
    if runtime not in ("apptainer", "singularity"):
        raise SpecError(f"--runtime {runtime!r} cannot build a SIF", "use apptainer or singularity")
    if not image or image.startswith("-") or any(c.isspace() for c in image):
        raise SpecError(f"image {image!r} is not a local image name", "e.g. mn5 or localhost/my-image:latest")
    out = output or default_output(image, target)
    if target == "sif":
        tar = os.path.abspath(re.sub(r"\.sif$", "", out) + ".tar")
        save = (
            ["docker", "save", image, "-o", tar]
            if source == "docker"
            else ["podman", "save", "--format", "docker-archive", "-o", tar, image]
        )
        # docker-archive:// takes an absolute path after the scheme: docker-archive:///abs/x.tar
        cmds = [save, [runtime, "build", out, f"docker-archive://{tar}"]]
        if not keep_tar:
            cmds.append(["rm", "-f", tar])
        return cmds
    if target == "sqsh":
        scheme = "dockerd://" if source == "docker" else "podman://"
        return [["enroot", "import", "--output", out, scheme + image]]
    return [["ch-convert", "-i", source, image, out]]


def run_steps(cmds: Sequence[Sequence[str]], runner: Runner, timeout: float = 3600.0) -> None:
    """Run each step in order; the first failure raises :class:`CommandError` with its argv."""
    for argv in cmds:
        runner.run(list(argv), timeout=timeout, hint="run the printed steps by hand to see their full output")
