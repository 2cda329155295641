"""The one quoting rule for generated shell text.

The renderers (schedulers/batch/base.py and its backends, launchers, containers) assemble
script lines, but every value that reaches a generated script passes through
:func:`quote`, :func:`join`, :func:`assignment` or :func:`directive` here.
Deliberate expansion (``$SLURM_JOB_ID``) is marked with :class:`Raw`, a real ``str`` subclass: a bare type alias as a
"don't quote" marker silently quotes nothing, which is the bug we avoid.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping

from torchhpc.errors import QuotingError

__all__ = [
    "Raw",
    "TrustedScript",
    "assignment",
    "directive",
    "export_lines",
    "join",
    "quote",
    "validate_env_name",
]

# Always used with fullmatch: ``$`` would also match before a final newline.
_SAFE = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")
# Characters that must not appear raw in script text: C0 controls (newline, CR...),
# DEL, and surrogates (bytes of an undecodable argument). Such values are written in
# bash's ANSI-C form $'...', so no value ever puts a raw newline into a script that
# sbatch or qsub reads line by line (``#PBS`` after a newline is a directive to them).
_CONTROL = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff]")
_DIRECTIVE_KEY = re.compile(r"-{0,2}[A-Za-z][A-Za-z0-9_-]*")
_C_ESCAPES = {"\\": "\\\\", "'": "\\'", "\n": "\\n", "\t": "\\t", "\r": "\\r"}


class TrustedScript(str):
    """Multi-line shell code written by torchhpc itself (the per-task shim), never user input.

    :func:`quote` keeps it as one readable single-quoted block, newlines and all.
    A comment line in it must be ``# text`` (a space after the ``#``): sbatch
    and qsub read ``#SBATCH``/``#PBS`` at a line start as a directive, wherever it
    is in the script.
    """

    __slots__ = ()

    def __new__(cls, text: str) -> TrustedScript:
        for line in text.split("\n"):
            if re.match(r"\s*#[^\s]", line):
                raise QuotingError(f"trusted script line {line!r} could be read as a directive")
        if "\0" in text or "\r" in text:
            raise QuotingError("a trusted script may not contain NUL or CR")
        return super().__new__(cls, text)


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
    if isinstance(value, TrustedScript):
        return shlex.quote(str(value))
    text = str(value)
    if text and _SAFE.fullmatch(text):
        return text
    if _CONTROL.search(text):
        return ansi_c(text)
    return shlex.quote(text)


def ansi_c(text: str) -> str:
    """bash's ``$'...'`` form: control characters as escapes, so the text stays on one line.

    Surrogates U+DC80..U+DCFF (how Python keeps the bytes of an undecodable
    argument) become ``\\xHH``, the original byte. NUL cannot be in any argument.
    """
    out: list[str] = []
    for ch in text:
        code = ord(ch)
        if ch in _C_ESCAPES:
            out.append(_C_ESCAPES[ch])
        elif code == 0:
            raise QuotingError(f"{text[:40]!r} contains a NUL byte", "no command argument or variable can carry one")
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif 0xDC80 <= code <= 0xDCFF:
            out.append(f"\\x{code - 0xDC00:02x}")
        elif 0xD800 <= code <= 0xDFFF:
            raise QuotingError(f"{text[:40]!r} contains a lone surrogate", "use UTF-8 text")
        else:
            out.append(ch)
    return "$'" + "".join(out) + "'"


def join(argv: Iterable[object]) -> str:
    """Join an argv into one shell command line, each word quoted."""
    return " ".join(quote(a) for a in argv)


def validate_env_name(name: str, source: str = "environment variable") -> str:
    """Reject names the shell cannot export (``A-B``, ``1X``, ``a b``)."""
    from torchhpc.core.validate import check_name

    return check_name(name, source)


def assignment(name: str, value: object) -> str:
    """``NAME=value`` with the value quoted (a ``Raw`` value expands)."""
    return f"{validate_env_name(name)}={quote(value)}"


def export_lines(env: Mapping[str, object]) -> list[str]:
    """``export NAME=value`` lines, in the mapping's order."""
    return [f"export {assignment(k, v)}" for k, v in env.items()]


def directive(prefix: str, key: str, value: object | None = None) -> str:
    """One scheduler directive line, e.g. ``#SBATCH --job-name="my job"``.

    sbatch reads a directive's argument itself (not through a shell): a
    backslash escapes the next character, double and single quotes group words,
    and an unquoted ``#`` starts a comment. So ``\\``, ``"``, ``'`` and ``#`` are
    escaped with a backslash and a value with whitespace is wrapped in double
    quotes; what no directive can carry (newlines, CR, NULs) is refused.
    """
    if not _DIRECTIVE_KEY.fullmatch(key):
        raise QuotingError(f"{key!r} is not a valid {prefix} option name")
    flag = key if key.startswith("-") else ("--" + key if len(key) > 1 else "-" + key)
    if value is None or value is True:
        return f"{prefix} {flag}"
    from torchhpc.core.validate import check_value

    text = check_value(str(value), f"{prefix} {flag} value", line=True)
    escaped = re.sub(r"""([\\"'#])""", r"\\\1", text)
    if text == "" or re.search(r"\s", text):
        escaped = f'"{escaped}"'
    sep = "=" if flag.startswith("--") else " "
    return f"{prefix} {flag}{sep}{escaped}"


# A word of a command line join() wrote: runs of $'...' (backslash escapes), '...', "..." (backslash escapes),
# a backslash and the character it escapes, or any character but the space that ends the word.
_WORD = re.compile(r"""(?:\$'(?:\\.|[^'\\])*'?|'[^']*'?|"(?:\\.|[^"\\])*"?|\\.?|[^ ])+""", re.S)


def split_words(line: str) -> list[str]:
    """The words of a command line that :func:`join` wrote, each exactly as written (quotes kept).

    Splits at spaces outside ``'...'``, ``"..."`` and ``$'...'``; for :func:`wrap_command`.
    """
    return _WORD.findall(line)


def wrap_command(line: str, breaks: Iterable[int] = (), width: int = 100, indent: str = "  ") -> list[str]:
    """One command line as lines a person can read: `` \\`` at argument boundaries.

    A new line starts before each word index in ``breaks`` (where a new command of a
    wrapper chain begins) and wherever the line would pass ``width``; an option and
    its value (``-x NAME``) stay together. Only the spaces between words change, so
    the command is the same.
    """
    words = split_words(line)
    starts = set(breaks)
    # units: an option with its value, or one word
    units: list[tuple[int, str]] = []
    i = 0
    while i < len(words):
        w = words[i]
        if (w.startswith("-") and "=" not in w and i + 1 < len(words) and i + 1 not in starts
                and not words[i + 1].startswith("-")):
            units.append((i, f"{w} {words[i + 1]}"))
            i += 2
        else:
            units.append((i, w))
            i += 1
    out: list[str] = []
    cur = ""
    for index, text in units:
        if cur and (index in starts or len(indent) + len(cur) + 1 + len(text) > width):
            out.append(cur)
            cur = text
        else:
            cur = f"{cur} {text}" if cur else text
    if cur:
        out.append(cur)
    return [(indent if k == 0 else indent + "  ") + part + (" \\" if k < len(out) - 1 else "") for k, part in enumerate(out)]
