"""Pyxis (enroot through srun): ``srun --container-image=… --container-mounts=… CMD``.

The command itself is unchanged; the container is described by srun flags, so
:func:`wrap` returns argv as is and :func:`srun_options` gives the flags. Pyxis'
syntax has no quoting: ``--container-mounts`` is a comma-separated list of
``SRC:DST[:FLAGS]``, ``--container-env`` a comma-separated list of names. A path with
a comma or colon cannot be expressed and is refused with a :class:`QuotingError`
naming it. In ``#SBATCH`` lines ``#`` starts a comment, so :func:`sbatch_directives`
escapes it (``nvcr.io\\#nvidia/pytorch``), as pyxis' README says.

Pyxis cannot be installed here: golden files check these flags against pyxis'
documented list (github.com/NVIDIA/pyxis, "Usage").
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torchhpc.containers._common as c
from torchhpc.core.shell import Raw, directive
from torchhpc.core.spec import ContainerSpec
from torchhpc.errors import QuotingError, SpecError

OPTIONS: dict[str, str] = {
    "name": "--container-name (reuse the unpacked container across steps of the job)",
    "mount_home": "false: --no-container-mount-home; true: --container-mount-home",
    "remap_root": "true: --container-remap-root; false: --no-container-remap-root",
    "writable": "true: --container-writable; false: --container-readonly",
    "entrypoint": "true: --container-entrypoint; false: --no-container-entrypoint",
    "save": "--container-save=PATH (squashfs of the container when the step ends)",
}

_TOGGLES = {
    "mount_home": ("--container-mount-home", "--no-container-mount-home"),
    "remap_root": ("--container-remap-root", "--no-container-remap-root"),
    "writable": ("--container-writable", "--container-readonly"),
    "entrypoint": ("--container-entrypoint", "--no-container-entrypoint"),
}


def wrap(container: ContainerSpec, argv: Sequence[str], how: c.Wrapping = c.PLAIN) -> list[str]:
    """Unchanged: srun (through pyxis) enters the container; srun's environment passes in."""
    srun_options(container)  # validate early, whoever renders first
    return list(argv)


def srun_options(container: ContainerSpec) -> list[str]:
    opts = c.options(container, OPTIONS)
    image = c.enroot_ref(c.image_word(container.image))
    out: list[str]
    if c.is_variable(image):  # "$SIF": srun's own shell expands it
        out = [Raw(f"--container-image={image}")]
    elif "," in image or "\n" in image:
        raise QuotingError(f"--container {image!r} contains a comma or newline", "pyxis cannot pass it")
    else:
        out = [f"--container-image={image}"]
    mounts = []
    for b in c.mounts(container, opts):
        for path in (b.src, b.dst):
            c.reject_chars(path, ",:", "pyxis' --container-mounts list (SRC:DST[:FLAGS],...)")
        mounts.append(f"{b.src}:{b.dst}" + (":ro" if b.readonly else ""))
    if mounts:
        out.append("--container-mounts=" + ",".join(mounts))
    wd = c.workdir(container, opts)
    if wd:
        c.reject_chars(wd, "\n", "srun's --container-workdir", "--container-workdir")
        out.append(f"--container-workdir={wd}")
    names, pairs = c.env_entries(container)
    if pairs:
        k, v = pairs[0]
        raise SpecError(
            f"--container-env {k}={v!r}: pyxis only passes host variables by name",
            f"set it on the job (--env {k}=...) and pass --container-env {k}",
        )
    wild = [n for n in names if n.endswith("*")]
    if wild:
        raise SpecError(
            f"--container-env {wild[0]!r}: pyxis takes names, not patterns",
            "list the names; srun's environment passes into pyxis containers anyway",
        )
    if names:
        out.append("--container-env=" + ",".join(names))
    if opts.get("name"):
        c.reject_chars(opts["name"], ",:/ \n", "pyxis' --container-name", "container name")
        out.append(f"--container-name={opts['name']}")
    for key, (on, off) in _TOGGLES.items():
        if key in opts:
            out.append(on if c.flag(opts, key) else off)
    if opts.get("save"):
        out.append(f"--container-save={os.path.abspath(opts['save'])}")
    out += c.split_args(opts)
    return out


def sbatch_directives(container: ContainerSpec) -> list[str]:
    """The same flags as ``#SBATCH`` lines (pyxis ≥ 0.12 applies them to every step).

    sbatch would read an unquoted ``#`` as the start of a comment, so it comes out as
    ``\\#`` (``nvcr.io\\#nvidia/pytorch``, as pyxis' README shows); :func:`directive`
    does that escaping for every directive.
    """
    if c.is_variable(container.image):
        raise QuotingError(
            f"--container {container.image}: an #SBATCH line cannot expand a variable",
            "give the image's path, or let torchhpc put it on the srun line",
        )
    parts = [opt.partition("=") for opt in srun_options(container)]
    return [directive("#SBATCH", key, value or None) for key, _, value in parts]
