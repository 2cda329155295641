"""The only module that produces shell text.

Every value that reaches a generated script passes through :func:`quote`,
:func:`join` or :func:`directive`. Deliberate expansion (``$SLURM_JOB_ID``) is
marked with :class:`Raw`, a real ``str`` subclass: a bare type alias as a
"don't quote" marker silently quotes nothing, which is the bug we avoid.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping

from torchhpc.errors import QuotingError

__all__ = [
    "Raw",
    "assignment",
    "directive",
    "export_lines",
    "join",
    "quote",
    "splice_vars",
    "validate_env_name",
]

_SAFE = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class Raw(str):
    """Text that must reach the shell unquoted, e.g. ``"$SLURM_JOB_ID"``.

    Only code, never user input, should build a ``Raw``.
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Raw({str.__repr__(self)})"


def quote(value: object) -> str:
    """Quote one word for POSIX sh/bash; ``Raw`` passes through untouched.

    Safe words stay bare so rendered scripts remain readable.
    """
    if isinstance(value, Raw):
        return str(value)
    text = str(value)
    if text and _SAFE.match(text):
        return text
    return shlex.quote(text)


def join(argv: Iterable[object]) -> str:
    """Join an argv into one shell command line, each word quoted."""
    return " ".join(quote(a) for a in argv)


def splice_vars(text: str, names: Iterable[str]) -> str:
    """Quote ``text`` for a double-quoted context but keep ``$NAME`` expansions of the given names.

    ``splice_vars("out-$SLURM_JOB_ID.log", ["SLURM_JOB_ID"])`` gives
    ``"out-${SLURM_JOB_ID}.log"``: the job id expands, nothing else can.
    """
    allowed = set(names)
    out: list[str] = []
    pos = 0
    pattern = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
    for m in pattern.finditer(text):
        name = m.group(1) or m.group(2)
        if name not in allowed:
            continue
        out.append(_dq_escape(text[pos : m.start()]))
        out.append("${" + name + "}")
        pos = m.end()
    out.append(_dq_escape(text[pos:]))
    return '"' + "".join(out) + '"'


def _dq_escape(text: str) -> str:
    return re.sub(r'([\\"$`])', r"\\\1", text)


def validate_env_name(name: str, source: str = "environment variable") -> str:
    """Reject names the shell cannot export (``A-B``, ``1X``, ``a b``)."""
    if not _ENV_NAME.match(name):
        raise QuotingError(
            f"{name!r} is not a valid {source} name",
            "use letters, digits and underscores, not starting with a digit",
        )
    return name


def assignment(name: str, value: object) -> str:
    """``NAME=value`` with the value quoted (a ``Raw`` value expands)."""
    return f"{validate_env_name(name)}={quote(value)}"


def export_lines(env: Mapping[str, object]) -> list[str]:
    """``export NAME=value`` lines, in the mapping's order."""
    return [f"export {assignment(k, v)}" for k, v in env.items()]


def directive(prefix: str, key: str, value: object | None = None) -> str:
    """One scheduler directive line, e.g. ``#SBATCH --job-name="my job"``.

    sbatch reads a directive's argument itself (not through a shell): a
    backslash escapes the next character, double quotes group words, and an
    unquoted ``#`` starts a comment. So ``\\``, ``"`` and ``#`` are escaped with
    a backslash and a value with whitespace is wrapped in double quotes; what
    no directive can carry (newlines, NULs) is rejected.
    """
    if not re.match(r"^-{0,2}[A-Za-z][A-Za-z0-9_-]*$", key):
        raise QuotingError(f"{key!r} is not a valid {prefix} option name")
    flag = key if key.startswith("-") else ("--" + key if len(key) > 1 else "-" + key)
    if value is None or value is True:
        return f"{prefix} {flag}"
    text = str(value)
    if "\n" in text or "\r" in text or "\0" in text:
        raise QuotingError(
            f"{prefix} {flag} value {text!r} contains a newline",
            "directive values must fit on one line",
        )
    escaped = re.sub(r'([\\"#])', r"\\\1", text)
    if text == "" or re.search(r"\s", text):
        escaped = f'"{escaped}"'
    sep = "=" if flag.startswith("--") else " "
    return f"{prefix} {flag}{sep}{escaped}"
