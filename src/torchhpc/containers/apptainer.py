"""Apptainer and Singularity: ``apptainer exec [--nv|--rocm] [--cleanenv] --bind … IMAGE CMD``.

Neither can be installed on the development machine (Debian's ``singularity`` package
is a game), so this rendering is golden-tested against the documented syntax
(apptainer.org/docs/user/main/cli/apptainer_exec.html; Singularity 3.x is the same
with ``SINGULARITYENV_`` instead of ``APPTAINERENV_``). The seeds' ``module load
singularity`` is a site profile setting, not part of the command.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

import torchhpc.containers._common as c
from torchhpc.core.shell import Raw, join
from torchhpc.core.spec import ContainerSpec
from torchhpc.errors import SpecError

OPTIONS: dict[str, str] = {
    "containall": "true: --containall (no $HOME, /tmp or cwd from the host)",
    "writable_tmpfs": "true: --writable-tmpfs (a scratch overlay, lost at exit)",
    "no_home": "true: --no-home (do not mount $HOME)",
    "gpu": "none: no --nv/--rocm even with GPUs (an image that brings its own GPU stack, as LUMI's PyTorch images do)",
    "sif_cache": "directory where a docker:// image is built into a SIF once, before the launch "
    "(default ${TORCHHPC_SIF_CACHE:-$HOME/.cache/torchhpc/sif}; 'none': every rank pulls it itself)",
}

# A docker:// image is converted once, by the batch script before any rank starts: every rank
# pulling and converting the same layers at once is minutes of start-up and a registry's rate limit.
DEFAULT_SIF_CACHE = "${TORCHHPC_SIF_CACHE:-$HOME/.cache/torchhpc/sif}"

# A reference like "nvcr.io/nvidia/pytorch:24.03-py3" or "ubuntu:22.04": no scheme,
# a tag or digest. Apptainer would take it for a file; it means docker://.
_DOCKER_REF = re.compile(r"^[a-z0-9][a-z0-9._-]*(?::[0-9]+)?(?:/[a-z0-9._-]+)*(?::[\w.-]+|@sha256:[0-9a-f]{64})$")


def image_uri(image: str) -> str:
    """SIF paths, sandboxes and URIs pass; a bare registry reference becomes ``docker://``."""
    if "://" in image or os.path.exists(image) or image.endswith((".sif", ".simg", ".img")):
        return image
    if _DOCKER_REF.match(image):
        return "docker://" + image
    return image


def cached_sif(container: ContainerSpec) -> Raw | None:
    """Where the batch script builds the SIF of a ``docker://`` image (``None``: not a docker:// image,
    or ``sif_cache=none``). A shell word: the cache directory expands when the job runs."""
    opts = c.options(container, OPTIONS)
    if c.is_variable(container.image) or opts.get("sif_cache", "") == "none":
        return None
    uri = image_uri(c.image_word(container.image))
    if not uri.startswith("docker://"):
        return None
    name = re.sub(r"[^A-Za-z0-9._-]", "_", uri[len("docker://"):]) + ".sif"
    cache = opts.get("sif_cache") or DEFAULT_SIF_CACHE
    if cache != DEFAULT_SIF_CACHE:
        c.check_value(cache, "apptainer option sif_cache", line=True, word=True)
        return Raw(join([cache]) + "/" + join([name]))
    return Raw(f'"{cache}"/{join([name])}')


def wrap(container: ContainerSpec, argv: Sequence[str], how: c.Wrapping = c.PLAIN) -> list[str]:
    opts = c.options(container, OPTIONS)
    exe = c.binary(container, opts, container.runtime)
    cmd = [exe, "exec"]
    gpu_flag = opts.get("gpu", "auto")
    if gpu_flag not in ("auto", "none"):
        raise SpecError(f"apptainer option gpu={gpu_flag!r} is not auto or none", "e.g. gpu=none")
    if how.gpus > 0 and gpu_flag == "auto":
        if how.gpu_kind == "nvidia":
            cmd.append("--nv")
        elif how.gpu_kind == "amd":
            cmd.append("--rocm")
        else:
            raise SpecError(f"GPU kind {how.gpu_kind!r} is not nvidia or amd", "set --gpu-kind nvidia|amd")
    if container.cleanenv:
        cmd.append("--cleanenv")
    cmd += c.switches(opts, {"containall": "--containall", "no_home": "--no-home", "writable_tmpfs": "--writable-tmpfs"})
    for b in c.binds(container):
        # --bind takes a comma-separated list of src[:dest[:opts]]
        c.reject_chars(b.src, ",:", "apptainer's --bind list")
        c.reject_chars(b.dst, ",:", "apptainer's --bind list")
        spec = b.src if b.src == b.dst else f"{b.src}:{b.dst}"
        if b.readonly:
            spec = f"{b.src}:{b.dst}:ro"
        cmd += ["--bind", spec]
    if container.workdir:
        cmd += ["--pwd", container.workdir]
    cmd += c.split_args(opts)
    sif = cached_sif(container)
    cmd += [sif if sif is not None else image_uri(c.image_word(container.image)), *argv]

    # Values go in as <PREFIX>NAME variables of the apptainer process: they survive
    # --cleanenv and, unlike --env, need no escaping of commas.
    prefix = "SINGULARITYENV_" if container.runtime == "singularity" else "APPTAINERENV_"
    _, pairs = c.env_entries(container)
    if pairs:
        cmd = ["env", *(f"{prefix}{k}={v}" for k, v in pairs), *cmd]
    if container.cleanenv:
        # Without --cleanenv the host environment passes anyway; with it, the rank and
        # scheduler variables must be re-exported under the prefix when the task starts.
        patterns = c.all_patterns(container, how.pass_env)
        if patterns:
            cmd = c.env_expand_argv("export", prefix, patterns, [], cmd, how)
    return cmd


def setup_lines(container: ContainerSpec) -> list[str]:
    """``docker://`` images: build the SIF once into the cache (atomically: a half-built file is
    never taken for the image), skipped when it is already there."""
    sif = cached_sif(container)
    if sif is None:
        return []
    opts = c.options(container, OPTIONS)
    exe = c.binary(container, opts, container.runtime)
    uri = image_uri(c.image_word(container.image))
    return [
        f"_torchhpc_sif={sif}",
        'if [ ! -f "$_torchhpc_sif" ]; then',
        '  mkdir -p "${_torchhpc_sif%/*}"',
        f'  {join([exe, "build"])} "$_torchhpc_sif.$$.tmp" {join([uri])} \\',  # a registry's image: two lines of <= 160
        f"    || {{ echo {join([f'torchhpc: {exe} build of {uri} failed'])} >&2; exit 1; }}",
        '  mv -f "$_torchhpc_sif.$$.tmp" "$_torchhpc_sif"',
        "fi",
    ]
