"""Site profiles: built-ins from the seeds plus the user's ``profiles.toml``.

Where user profiles live, first found wins:

1. ``$TORCHHPC_PROFILES`` (a path; several joined with ``:`` are read in order,
   later files overriding earlier ones);
2. ``$XDG_CONFIG_HOME/torchhpc/profiles.toml`` (default ``~/.config/torchhpc/profiles.toml``).

Each top-level table is one profile::

    [lumi]                      # same name as a built-in: extends it
    account = "project_465001726"

    [mylab]
    extends = "mn5"
    qos = "acc_bsccs"
    env = { NCCL_DEBUG = "WARN" }

Unknown keys raise :class:`~torchhpc.errors.ConfigError` listing the valid ones.
TOML is read with the standard ``tomllib`` (Python 3.11+) or ``tomli`` if
installed; without either, only the built-ins are available and reading a
user file says so.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

from torchhpc.errors import ConfigError, UsageError
from torchhpc.profiles.builtin import BUILTIN
from torchhpc.profiles.model import FIELD_DOCS, Profile

__all__ = [
    "BUILTIN",
    "FIELD_DOCS",
    "Profile",
    "get_profile",
    "list_profiles",
    "load_user_profiles",
    "user_profile_paths",
]


def user_profile_paths(environ: Mapping[str, str] | None = None) -> list[Path]:
    env = os.environ if environ is None else environ
    if env.get("TORCHHPC_PROFILES"):
        return [Path(p).expanduser() for p in env["TORCHHPC_PROFILES"].split(os.pathsep) if p]
    base = env.get("XDG_CONFIG_HOME") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".config")
    return [Path(base) / "torchhpc" / "profiles.toml"]


def _toml_loads(text: str, source: str) -> dict[str, Any]:
    try:
        import tomllib as toml  # Python 3.11+
    except ModuleNotFoundError:  # pragma: no cover - depends on the interpreter
        try:
            import tomli as toml  # type: ignore[no-redef]
        except ModuleNotFoundError:
            raise ConfigError(
                f"cannot read {source}: this Python has no TOML reader",
                "use Python >= 3.11 or `pip install tomli`",
            ) from None
    try:
        return dict(toml.loads(text))
    except toml.TOMLDecodeError as e:
        raise ConfigError(f"{source} is not valid TOML: {e}", "fix the line it names") from None


def _not_utf8(path: object, e: UnicodeDecodeError) -> str:
    """The message for a TOML file that is not UTF-8 text: the first bad byte and its line."""
    line = e.object[: e.start].count(b"\n") + 1
    return f"{path} is not UTF-8 text (byte {e.object[e.start]:#04x} on line {line})"


def load_user_profiles(environ: Mapping[str, str] | None = None) -> dict[str, Profile]:
    """The user's profiles, unresolved (``extends`` not applied yet)."""
    env = os.environ if environ is None else environ
    explicit = bool(env.get("TORCHHPC_PROFILES"))
    out: dict[str, Profile] = {}
    for path in user_profile_paths(env):
        if not path.exists():
            if explicit:
                raise ConfigError(
                    f"TORCHHPC_PROFILES names {str(path)!r}, which does not exist",
                    "fix the path or unset TORCHHPC_PROFILES",
                )
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as e:
            raise ConfigError(f"cannot read {path}: {e.strerror}") from None
        except UnicodeDecodeError as e:
            raise ConfigError(_not_utf8(path, e), "save it as UTF-8 (TOML files are UTF-8)") from None
        for name, table in _toml_loads(text, str(path)).items():
            if not isinstance(table, dict):
                raise ConfigError(
                    f"{path}: top-level key {name!r} is not a profile table",
                    f'write [{name}] followed by keys such as scheduler = "slurm"',
                )
            if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", name):
                raise ConfigError(f"{path}: profile name {name!r} is not usable on a command line")
            out[name] = Profile.from_mapping(name, table, str(path))
    return out


def list_profiles(environ: Mapping[str, str] | None = None) -> list[str]:
    """Built-in names, then user-only names, each once."""
    return _names(load_user_profiles(environ))


def _names(user: Mapping[str, Profile]) -> list[str]:
    return list(BUILTIN) + [n for n in user if n not in BUILTIN]


def get_profile(name: str, environ: Mapping[str, str] | None = None) -> Profile:
    """The resolved profile ``name`` (user file over built-in, ``extends`` applied).

    Its ``setup`` already starts with ``module load`` lines for ``modules``, so
    a renderer can put ``setup`` at the top of a batch script as it is.
    """
    user = load_user_profiles(environ)
    return _resolve(name, user, []).finalized()


def _resolve(name: str, user: dict[str, Profile], chain: list[str]) -> Profile:
    if name in chain:
        raise ConfigError(f"profile {name!r} extends itself: {' -> '.join([*chain, name])}")
    mine: Optional[Profile] = user.get(name)
    if mine is None:
        if name in BUILTIN:
            return BUILTIN[name]
        from torchhpc.core.suggest import did_you_mean

        valid = _names(user)
        near = did_you_mean(name, valid)
        raise UsageError(
            f"--profile {name!r} is not a known profile",
            (f"{near} " if near else "") + f"choose from: {', '.join(valid)} (or add [{name}] to {user_profile_paths()[0]})",
        )
    parent = mine.extends or (name if name in BUILTIN else None)
    if parent is None:
        return mine
    if parent == name:  # a user table named like a built-in extends the built-in
        if name not in BUILTIN:
            raise ConfigError(f"profile {name!r} extends itself", "extend a built-in or another profile")
        base = BUILTIN[name]
    else:
        base = _resolve(parent, user, [*chain, name])
    return mine.merged_onto(base)
