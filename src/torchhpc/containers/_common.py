"""Pieces every runtime wrapper shares: binds, env entries, options, the runtime binary.

Kept apart from ``__init__`` so runtime modules import it without importing each other.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from torchhpc.core.shell import Raw
from torchhpc.core.spec import ContainerSpec
from torchhpc.core.units import parse_switch
from torchhpc.core.validate import check_name, check_value
from torchhpc.errors import ConfigError, QuotingError, SpecError

# Options every runtime understands (runtime modules add their own).
COMMON_OPTIONS: dict[str, str] = {
    "binary": "the runtime executable (default: the runtime's name, or $TORCHHPC_<RUNTIME>_BINARY), "
    "e.g. a site wrapper such as bsc_singularity",
    "args": "extra arguments for the runtime's run/exec command, shell-split (e.g. '--cgroups=disabled')",
    "mount_cwd": "bind the working directory at the same path and start there (default true; "
    "apptainer and singularity do this themselves)",
}

# The installed boot directory (launchers/boot.py; not imported: containers and launchers stay apart): its
# shell programs env.sh and gpus.sh run a wrapped command where argv alone cannot.
BOOT_DIR = str(Path(__file__).resolve().parent.parent / "boot")
# Used with fullmatch only: ``$`` would also match before a final newline.
_ENV_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\*?|\*")


@dataclass(frozen=True)
class Bind:
    """One ``SRC[:DST[:ro]]`` bind, with DST defaulting to SRC."""

    src: str
    dst: str
    readonly: bool = False

    @classmethod
    def parse(cls, text: str, *, absolute: bool = False) -> Bind:
        """Parse ``--bind`` text; ``absolute`` resolves a relative SRC (docker would
        otherwise take ``data:/data`` as a named volume)."""
        parts = text.split(":")
        if len(parts) > 3 or not parts[0]:
            raise SpecError(f"--bind {text!r} is not SRC[:DST[:ro]]", "paths cannot contain ':'")
        explicit_dst = len(parts) > 1 and bool(parts[1])
        src = os.path.abspath(parts[0]) if absolute else parts[0]
        dst = parts[1] if explicit_dst else src
        mode = parts[2] if len(parts) > 2 else "rw"
        if mode not in ("ro", "rw"):
            raise SpecError(f"--bind {text!r}: mode {mode!r} is not ro or rw", "write SRC:DST:ro")
        for path in (src, dst):
            if any(c in path for c in "\n\r\0"):
                raise QuotingError(f"--bind path {path!r} contains a newline or NUL", "rename the path")
        if absolute and not dst.startswith("/"):
            raise SpecError(
                f"--bind {text!r}: the container path {dst!r} is relative",
                "give an absolute path inside the container, e.g. SRC:/data",
            )
        return cls(src, dst, mode == "ro")


@dataclass(frozen=True)
class Wrapping:
    """How a rank's command enters its container, the same for every runtime: ``gpus`` > 0 asks for
    the node's GPUs of ``gpu_kind`` ("nvidia" or "amd"); ``pass_env`` lists the variable names and
    ``PREFIX*`` patterns that must reach the process inside; ``interactive`` asks for a terminal;
    ``boot_var`` names the script's variable holding the boot directory ("": the installed one)."""

    gpus: int = 0
    gpu_kind: str = "nvidia"
    pass_env: tuple[str, ...] = ()
    interactive: bool = False
    boot_var: str = ""

    def program(self, name: str) -> str:
        """The word that names a shell program of the boot directory (env.sh, gpus.sh)."""
        return Raw(f'"${self.boot_var}/{name}"') if self.boot_var else os.path.join(BOOT_DIR, name)


PLAIN = Wrapping()


def binds(container: ContainerSpec, *, absolute: bool = False) -> list[Bind]:
    return [Bind.parse(b, absolute=absolute) for b in container.binds]


def reject_chars(path: str, chars: str, syntax: str, source: str = "--bind") -> None:
    """Raise a :class:`QuotingError` naming the path when ``syntax`` cannot carry it."""
    bad = sorted({c for c in path if c in chars})
    if bad:
        shown = " ".join(repr(c) for c in bad)
        raise QuotingError(
            f"{source} path {path!r} contains {shown}, which {syntax} cannot express",
            "rename or symlink the directory to a path without those characters",
        )


def env_entries(container: ContainerSpec) -> tuple[list[str], list[tuple[str, str]]]:
    """Split ``--container-env`` into names/patterns (host value passes) and NAME=VALUE pairs."""
    names: list[str] = []
    pairs: list[tuple[str, str]] = []
    for item in container.env:
        if "=" in item:
            k, v = item.split("=", 1)
            pairs.append((check_name(k, "--container-env"), v))
        else:
            names.append(check_pattern(item, "--container-env"))
    return names, pairs


def check_pattern(name: str, source: str = "pass_env") -> str:
    """A variable name, or a prefix ending in ``*`` (``SLURM_*``)."""
    if not _ENV_PATTERN.fullmatch(name):
        raise SpecError(
            f"{source} {name!r} is neither a variable name nor a PREFIX_* pattern",
            "use NAME, NAME=VALUE or a prefix like SLURM_*",
        )
    return name


def all_patterns(container: ContainerSpec, pass_env: Sequence[str]) -> list[str]:
    """pass_env + the container's own names, in order, without duplicates."""
    names, _ = env_entries(container)
    return list(dict.fromkeys([*(check_pattern(p) for p in pass_env), *names]))


def options(container: ContainerSpec, allowed: Mapping[str, str]) -> dict[str, str]:
    """The container's options as a dict; an unknown key lists the valid ones."""
    opts = dict(container.options)
    for key in opts:
        if key not in allowed and key not in COMMON_OPTIONS:
            valid = ", ".join(sorted({*allowed, *COMMON_OPTIONS}))
            raise ConfigError(
                f"container option {key!r} is not known to the {container.runtime} runtime",
                f"valid options: {valid}",
            )
    return opts


def flag(opts: Mapping[str, str], key: str, default: bool = False) -> bool:
    if key not in opts:
        return default
    if not str(opts[key]).strip():
        return False  # a bare ``key=``: off
    try:
        return parse_switch(opts[key], f"container option {key}")
    except SpecError as e:
        raise ConfigError(e.message, e.hint) from None


def split_args(opts: Mapping[str, str], key: str = "args") -> list[str]:
    value = opts.get(key, "")
    try:
        return shlex.split(value)
    except ValueError as e:
        raise ConfigError(f"container option {key}={value!r} cannot be split: {e}") from None


def binary(container: ContainerSpec, opts: Mapping[str, str], default: str) -> str:
    """Option ``binary`` > ``$TORCHHPC_<RUNTIME>_BINARY`` > the runtime's own name."""
    if opts.get("binary"):
        return check_value(opts["binary"], "container option binary", word=True)
    var = f"TORCHHPC_{container.runtime.upper()}_BINARY"
    return check_value(os.environ.get(var) or default, var, word=True)


def image_word(image: str, source: str = "--container") -> str:
    """An image as a positional word: never one that starts with '-' (it would become a runtime flag)."""
    if isinstance(image, Raw):
        return image
    return check_value(image, source, line=True, word=True, empty=False)


def is_variable(image: str) -> bool:
    """A site variable such as LUMI's ``$SIF``, expanded in the job (a :class:`Raw` image)."""
    return isinstance(image, Raw)


def workdir(container: ContainerSpec, opts: Mapping[str, str]) -> str | None:
    """Where the process starts inside: the spec's workdir, else (mount_cwd) the current one."""
    if container.workdir:
        return container.workdir
    if flag(opts, "mount_cwd", True):
        return os.getcwd()
    return None


def mounts(container: ContainerSpec, opts: Mapping[str, str]) -> list[Bind]:
    """The ``--bind`` binds (SRC made absolute), then the working directory's when mount_cwd is on
    and no bind already covers it."""
    bound = binds(container, absolute=True)
    if not flag(opts, "mount_cwd", True):
        return bound
    cwd = os.getcwd()
    if any(b.dst == cwd or cwd.startswith(b.dst.rstrip("/") + "/") for b in bound):
        return bound
    return [*bound, Bind(cwd, cwd)]


def switches(opts: Mapping[str, str], table: Mapping[str, str]) -> list[str]:
    """The runtime flag of each on/off option of ``table`` (option -> flag) that is on."""
    return [f for key, f in table.items() if flag(opts, key)]


def env_expand_argv(mode: str, arg: str, patterns: Sequence[str], head: Sequence[str], tail: Sequence[str],
                    how: Wrapping = PLAIN) -> list[str]:
    """argv that runs ``head + flags(patterns) + tail`` with flags found in the live environment (boot/env.sh:
    argv cannot expand "SLURM_*", the job's variables exist only on the compute node)."""
    return ["bash", how.program("env.sh"), mode, arg, str(len(patterns)), *patterns, str(len(head)), *head, *tail]


def is_image_file(image: str) -> bool:
    """A squashfs/SIF/tar path rather than a registry reference (a ``$SIF`` variable names a file)."""
    return is_variable(image) or image.startswith(("/", "./", "../", "~")) or image.endswith(
        (".sqsh", ".squashfs", ".sif", ".tar", ".tar.gz")
    )


def enroot_ref(image: str) -> str:
    """Docker-style ``nvcr.io/nvidia/pytorch:24.03-py3`` -> enroot/pyxis ``nvcr.io#nvidia/pytorch:24.03-py3``.

    Enroot separates the registry with ``#`` (``docker://[USER@][REGISTRY#]IMAGE[:TAG]``);
    given the docker form it would look for ``nvcr.io/nvidia/pytorch`` on Docker Hub.
    The first component is a registry when it has a dot, a port, or is ``localhost``
    (Docker's own rule).
    """
    if is_variable(image):
        return image
    ref = image.removeprefix("docker://")
    if "#" in ref or is_image_file(image):
        return ref
    user = ""
    if "@" in ref.split("/", 1)[0]:
        user, ref = ref.split("@", 1)
        user += "@"
    first, _, rest = ref.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return f"{user}{first}#{rest}"
    return user + ref
