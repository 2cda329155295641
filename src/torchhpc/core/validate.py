"""One place that decides which user values torchhpc can carry, and where.

Two rules, applied by every backend through the job spec and the renderers:

* :func:`check_name` -- a variable name the shell can export (``--env NAME``,
  ``--container-env NAME``), not one of the names the generated scripts use
  themselves (``_torchhpc_*``).
* :func:`check_value` -- a value: never a NUL (no argv or environment can hold
  one), never text that cannot be written out (lone surrogates from undecodable
  arguments are refused where a file must hold them), with ``line=True`` never a
  newline or carriage return (where a line parser reads it: ``#SBATCH``/``#PBS``
  directives, YAML keys, comments), with ``word=True`` never a leading ``-`` (where
  a program would take it for an option), with ``empty=False`` never ``""``.

Regular expressions here use :func:`re.fullmatch`: ``$`` also matches before a
final newline, which is how ``x\\n`` once slipped through as a "safe" word.
"""

from __future__ import annotations

import re

from torchhpc.errors import QuotingError, SpecError

__all__ = [
    "RESERVED_PREFIX",
    "check_dns_label",
    "check_name",
    "check_value",
    "encodable",
]

# Variables the generated scripts use for themselves; a user's --env of the same
# name would be overwritten (or overwrite ours).
RESERVED_PREFIX = "_torchhpc_"

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DNS_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
_LINE_BREAKS = ("\n", "\r")


def _shown(value: str, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 5] + "...'"


def check_name(name: str, field: str = "--env") -> str:
    """A shell variable name (``[A-Za-z_][A-Za-z0-9_]*``) outside the reserved ``_torchhpc_`` prefix."""
    if not isinstance(name, str) or not _IDENT.fullmatch(name):
        raise QuotingError(
            f"{field} {_shown(str(name))} is not a valid variable name",
            "use letters, digits and underscores, not starting with a digit (NAME=VALUE)",
        )
    if name.lower().startswith(RESERVED_PREFIX):
        raise QuotingError(
            f"{field} {name!r}: names starting with {RESERVED_PREFIX!r} are reserved for torchhpc's own script variables",
            "rename the variable",
        )
    return name


def encodable(value: str) -> bool:
    """Whether ``value`` can be written as UTF-8 (bytes from an undecodable argument count: they round-trip)."""
    try:
        value.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return False
    return True


def check_value(
    value: str,
    field: str,
    *,
    line: bool = False,
    word: bool = False,
    empty: bool = True,
    max_len: int | None = None,
) -> str:
    """Refuse what ``field`` cannot carry; return ``value`` unchanged.

    ``line``: the value reaches a line parser (a directive, a comment, a YAML key):
    no newline, carriage return, or text outside UTF-8. ``word``: the value is a
    positional word of some command (an image, a program): no leading ``-``.
    """
    if not isinstance(value, str):
        raise SpecError(f"{field} {value!r} is not text")
    if not empty and value == "":
        raise SpecError(f"{field} is empty", f"give a value for {field}")
    if "\0" in value:
        raise QuotingError(f"{field} {_shown(value)} contains a NUL byte", "no command argument can carry one")
    if not encodable(value):
        raise QuotingError(f"{field} {_shown(value)} is not valid text (a lone surrogate)", "use UTF-8 text")
    if line:
        if any(c in value for c in _LINE_BREAKS):
            raise QuotingError(
                f"{field} {_shown(value)} contains a newline or carriage return",
                f"{field} must fit on one line",
            )
        if any(0xDC80 <= ord(c) <= 0xDCFF for c in value):
            raise QuotingError(f"{field} {_shown(value)} is not valid UTF-8", "use UTF-8 text")
    if word and value.startswith("-"):
        raise SpecError(
            f"{field} {_shown(value)} starts with '-' and would be read as an option",
            "write it as ./NAME (a path) or rename it",
        )
    if max_len is not None and len(value) > max_len:
        raise SpecError(f"{field} is {len(value)} characters long (at most {max_len})")
    return value


def check_dns_label(value: str, field: str) -> str:
    """A Kubernetes DNS-1123 label: lower-case letters, digits and '-', 1-63 characters, alphanumeric ends."""
    if not isinstance(value, str) or not _DNS_LABEL.fullmatch(value):
        raise SpecError(
            f"{field} {_shown(str(value))} is not a DNS-1123 label",
            "use 1-63 lower-case letters, digits and '-', starting and ending with a letter or digit",
        )
    return value
