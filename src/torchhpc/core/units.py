"""Sizes, wall times, durations, switches and counts: parsed once with errors that name the value and its
source, and printed the way a person writes them. The one grammar for flags, the config file, environment
variables and JobSpec alike (the stdlib-only rank boot keeps a copy of the off words, held equal by a test)."""

from __future__ import annotations

import re

from torchhpc.errors import SpecError

__all__ = ["HANG_FLOOR_S", "OFF_WORDS", "ON_WORDS", "counted", "format_bytes", "format_walltime", "is_off", "parse_seconds",
           "parse_size", "parse_switch", "parse_timeout", "parse_walltime", "plural"]

ON_WORDS = ("1", "true", "yes", "on")
OFF_WORDS = ("0", "false", "no", "off", "none")
HANG_FLOOR_S = 5  # a hang timeout under this calls slow steps (an import, a checkpoint load) hangs


def is_off(text: object) -> bool:
    """Whether a switch or a timeout is turned off: ``0``, ``false``, ``no``, ``off``, ``none`` (any case)."""
    return str(text).strip().lower() in OFF_WORDS


def parse_switch(text: object, source: str) -> bool:
    """``1/true/yes/on`` or ``0/false/no/off/none``; anything else is an error, never a silent false."""
    word = str(text).strip().lower()
    if word in ON_WORDS:
        return True
    if word in OFF_WORDS:
        return False
    raise SpecError(f"{source}={text!r} is not a boolean", "use true or false (1/0, yes/no, on/off)")


def parse_timeout(text: object, source: str = "--hang-timeout", floor: float = HANG_FLOOR_S) -> float:
    """``SECONDS|off``: 0.0 when off, else seconds (``90``, ``7.5``, ``5m``, ``00:05:00``), at least ``floor``."""
    if is_off(text) or (isinstance(text, (int, float)) and text == 0):
        return 0.0
    if isinstance(text, (int, float)):
        seconds = float(text)
    elif re.fullmatch(r"\s*\d+(\.\d*)?\s*", str(text)):
        seconds = float(str(text))
    else:
        try:
            seconds = float(parse_seconds(str(text), source))
        except SpecError:
            raise SpecError(f"{source} {text!r} is not a number of seconds", "write 300, 5m or 00:05:00, or off") from None
    if seconds < floor:
        raise SpecError(f"{source} {text}: a hang timeout under {floor:g} seconds would call slow steps hangs",
                        f"give {floor:g} seconds or more, or off")
    return seconds

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGTP]?)(i?B?)?\s*$", re.IGNORECASE)
_POW = {"": 0, "K": 1, "M": 2, "G": 3, "T": 4, "P": 5}


def parse_size(text: str | int, source: str = "size") -> int:
    """``128M``/``8G``/``1K``/``4096`` to bytes (binary multiples, as Slurm and nccl-tests read them)."""
    if isinstance(text, int):
        if text < 0:
            raise SpecError(f"{source}={text} is negative")
        return text
    m = _SIZE.match(str(text))
    if not m:
        raise SpecError(f"{source}={text!r} is not a size", "write it like 512, 128K, 128M or 8G")
    number, unit = float(m.group(1)), m.group(2).upper()
    return int(number * (1024 ** _POW[unit]))


def format_bytes(n: int) -> str:
    """Shortest exact Slurm-style size: 8589934592 -> ``8G``; 1000 -> ``1000``."""
    for unit in ("P", "T", "G", "M", "K"):
        f = 1024 ** _POW[unit]
        if n >= f and n % f == 0:
            return f"{n // f}{unit}"
    return str(n)


def parse_walltime(text: str | int, source: str = "time") -> int:
    """Slurm wall-time formats to seconds.

    ``MM``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``. Slurm's ``MM:SS`` is refused: people
    write ``1:30`` meaning an hour and a half, and Slurm would give the job 90 seconds.
    """
    if isinstance(text, int):
        if text <= 0:
            raise SpecError(f"{source}={text} must be positive")
        return text * 60
    s = str(text).strip()
    hint = "use MM, HH:MM:SS or D-HH:MM:SS (e.g. 30, 01:30:00, 2-00:00:00)"
    m = re.match(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$", s)
    if not m:
        raise SpecError(f"{source}={text!r} is not a wall time", hint)
    days, a, b, c = m.groups()
    if days is None and b is not None and c is None:  # Slurm's MM:SS: "1:30" would be 90 seconds, not 1 h 30
        hours, minutes = int(a) * 3600 + int(b) * 60, int(a) * 60 + int(b)  # each suggestion valid as written
        raise SpecError(
            f"{source}={text!r} is ambiguous: Slurm reads A:B as minutes:seconds ({minutes} s)",
            f"write HH:MM:SS: {format_walltime(hours)} for {a} h {b} min, or {format_walltime(minutes)} for {a} min {b} s",
        )
    if days is None:
        if b is None:
            total = int(a) * 60
        elif c is None:
            total = int(a) * 60 + int(b)
        else:
            total = int(a) * 3600 + int(b) * 60 + int(c)
        parts = [int(x) for x in (b, c) if x is not None]
    else:
        h, mi, se = int(a), int(b or 0), int(c or 0)
        total = int(days) * 86400 + h * 3600 + mi * 60 + se
        parts = [mi, se]
        if h >= 24:  # Slurm would carry it into the days: say so rather than change what was asked
            raise SpecError(f"{source}={text!r} has {h} hours beside a day count", f"write {format_walltime(total)}")
    if any(p >= 60 for p in parts):
        raise SpecError(f"{source}={text!r} has minutes or seconds >= 60", hint)
    if total <= 0:
        raise SpecError(f"{source}={text!r} must be positive", hint)
    return total


def parse_seconds(text: str | int, source: str = "seconds") -> int:
    """A lead time in seconds: ``300``, ``300s``, ``5m``, ``1h``, ``1h30m``, or ``HH:MM:SS`` (a bare number is
    seconds here, unlike a wall time's minutes: ``--signal-before 300``)."""
    if isinstance(text, int):
        return text
    s = str(text).strip().lower()
    if re.fullmatch(r"\d+:\d\d:\d\d", s):
        h, mi, sec = (int(x) for x in s.split(":"))
        return h * 3600 + mi * 60 + sec
    found = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s?)?", s)
    if not s or found is None or not any(found.groups()):
        raise SpecError(f"{source} {text!r} is not a number of seconds", "write 300, 300s, 5m, 1h30m or 00:05:00")
    h, mi, sec = (int(x or 0) for x in found.groups())
    return h * 3600 + mi * 60 + sec


def format_walltime(seconds: int) -> str:
    """Seconds to ``[D-]HH:MM:SS``, which sbatch and qsub both accept."""
    d, rem = divmod(int(seconds), 86400)
    h, rem = divmod(rem, 3600)
    m, s = divmod(rem, 60)
    hms = f"{h:02d}:{m:02d}:{s:02d}"
    return f"{d}-{hms}" if d else hms


def plural(n: float, word: str, many: str = "") -> str:
    """The word for ``n`` of a thing: ``node`` for one, else ``nodes`` (or ``many``: ``processes``,
    ``are`` for ``is``). Where the items are named instead of counted: ``ranks 0,2``."""
    return word if n == 1 else many or word + "s"


def counted(n: int, noun: str, many: str = "") -> str:
    """``1 node``, ``2 nodes``, ``2 processes``: a count as a sentence says it, never ``node(s)``."""
    return f"{n} {plural(n, noun, many)}"
