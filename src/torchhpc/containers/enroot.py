"""Enroot without pyxis: ``enroot import`` / ``enroot create`` once, ``enroot start`` per task.

:func:`setup_lines` imports the image to a squashfs file and creates the container
(both skipped when already done, so a rerun is cheap); :func:`wrap` starts it with
``--mount SRC:DST`` and ``--env NAME`` (enroot does not pass the host environment by
itself). Enroot has no working-directory flag, so the command is started through a
``cd`` in the container's ``sh``. With a node-local ``ENROOT_DATA_PATH`` on several nodes,
set ``create=false``: each task then starts the shared squashfs directly (needs
fuse-overlayfs and squashfuse, Linux ≥ 4.18).

Enroot cannot be installed here: golden files check this against its documentation
(github.com/NVIDIA/enroot, doc/cmd/import.md, create.md, start.md).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

import torchhpc.containers._common as c
from torchhpc.core.shell import join
from torchhpc.core.spec import ContainerSpec

OPTIONS: dict[str, str] = {
    "name": "container name for enroot create/start (default: from the image, e.g. pytorch+24.03-py3)",
    "sqsh": "squashfs file enroot import writes (default: NAME.sqsh in the working directory)",
    "create": "false: start the squashfs directly instead of enroot create (node-local data paths)",
    "rw": "true: --rw (writable root filesystem)",
    "root": "true: --root (remap the user to root inside)",
}

_CD = 'cd "$1" || exit 1; shift; exec "$@"'


def container_name(container: ContainerSpec) -> str:
    """``nvcr.io/nvidia/pytorch:24.03-py3`` -> ``pytorch+24.03-py3`` (enroot's own naming)."""
    opts = c.options(container, OPTIONS)
    if opts.get("name"):
        c.reject_chars(opts["name"], "/ :\n", "an enroot container name", "name")
        return c.check_value(opts["name"], "enroot option name", word=True)
    if c.is_variable(container.image):  # "$SIF": name the container after the variable
        return re.sub(r"[^A-Za-z0-9_]", "", container.image) or "torchhpc"
    ref = c.enroot_ref(container.image)
    base = os.path.basename(ref.split("#")[-1])
    for suffix in (".sqsh", ".squashfs"):
        base = base.removesuffix(suffix)
    return re.sub(r"[^A-Za-z0-9_.+-]", "+", base.replace(":", "+")) or "torchhpc"


def squashfs(container: ContainerSpec) -> str:
    opts = c.options(container, OPTIONS)
    if c.is_image_file(container.image):
        return c.image_word(container.image)
    if opts.get("sqsh"):
        return c.check_value(opts["sqsh"], "enroot option sqsh", line=True, word=True)
    return f"{container_name(container)}.sqsh"


def import_uri(image: str) -> str:
    """``docker://REGISTRY#IMAGE:TAG`` for enroot import; ``dockerd://``/``podman://`` pass."""
    if image.startswith(("dockerd://", "podman://")):
        return image
    return "docker://" + c.enroot_ref(image)


def setup_lines(container: ContainerSpec) -> list[str]:
    sqsh = squashfs(container)
    lines = []
    if not c.is_image_file(container.image):
        lines.append(
            f"[ -f {join([sqsh])} ] || {join(['enroot', 'import', '--output', sqsh, import_uri(container.image)])}"
        )
    lines += per_node_lines(container)
    return lines


def per_node_lines(container: ContainerSpec) -> list[str]:
    """``enroot create`` writes the container into the node's ``ENROOT_DATA_PATH`` (node-local on
    most sites): every node of the job needs its own, made before the launch. A batch scheduler
    that can run a command once per node (Slurm: ``srun --ntasks-per-node=1``) runs these there;
    in :func:`setup_lines` they run once, where the script runs."""
    opts = c.options(container, OPTIONS)
    if not c.flag(opts, "create", True):
        return []
    name = container_name(container)
    return [f"enroot list | grep -qxF {join([name])} || {join(['enroot', 'create', '--name', name, squashfs(container)])}"]


def wrap(container: ContainerSpec, argv: Sequence[str], how: c.Wrapping = c.PLAIN) -> list[str]:
    # GPUs need no flag: enroot's nvidia hook follows NVIDIA_VISIBLE_DEVICES, which
    # the patterns below pass when the caller includes it.
    opts = c.options(container, OPTIONS)
    head = [c.binary(container, opts, "enroot"), "start", *c.switches(opts, {"rw": "--rw", "root": "--root"})]
    for b in c.mounts(container, opts):
        # fstab fields, colon-separated on the command line; whitespace ends a field
        for path in (b.src, b.dst):
            c.reject_chars(path, ": \t", "enroot's --mount (colon-separated fstab fields)")
        spec = f"{b.src}:{b.dst}"
        if b.readonly:
            spec += ":none:x-create=auto,rbind,ro"
        head += ["--mount", spec]
    patterns = c.all_patterns(container, how.pass_env)
    exact = [p for p in patterns if not p.endswith("*")]
    wild = [p for p in patterns if p.endswith("*")]
    for name in exact:
        head += ["--env", name]
    _, pairs = c.env_entries(container)
    for k, v in pairs:
        head += ["--env", f"{k}={v}"]
    head += c.split_args(opts)
    target = container_name(container) if c.flag(opts, "create", True) else squashfs(container)
    wd = c.workdir(container, opts)
    inner = ["sh", "-c", _CD, "torchhpc-cd", wd, *argv] if wd else list(argv)
    tail = [target, *inner]
    if wild:
        return c.env_expand_argv("flag", "--env", wild, head, tail, how)
    return head + tail
