"""A deterministic YAML emitter for the manifests (TrainJob, PyTorchJob, ConfigMap): PyYAML is never a
runtime dependency, and one emitter makes every render byte-for-byte the same."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from torchhpc.errors import QuotingError

__all__ = ["to_yaml"]


# fullmatch only: ``$`` would also match before a final newline.
_PLAIN = re.compile(r"[A-Za-z_/][A-Za-z0-9_./=+-]*(?::[A-Za-z0-9_./=+-]+)*")
_YAML_WORDS = {"y", "n", "yes", "no", "on", "off", "true", "false", "null", "~"}


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return json.dumps(value)
    text = str(value)
    if _PLAIN.fullmatch(text) and text.lower() not in _YAML_WORDS:
        return text
    return _double_quoted(text)


def _printable(code: int) -> bool:
    return 0x20 <= code <= 0x7E or (0xA0 <= code <= 0xFFFD and code not in (0x2028, 0x2029, 0xFEFF)) or code > 0xFFFF


def _double_quoted(text: str) -> str:
    """A YAML double-quoted scalar: printable characters as they are (emoji included, never as
    JSON's surrogate pairs, which YAML parsers reject), everything else as an escape."""
    out = ['"']
    for ch in text:
        code = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif 0xD800 <= code <= 0xDFFF:
            raise QuotingError(f"{text[:40]!r} is not valid UTF-8 (a manifest holds only text)", "use UTF-8 text")
        elif _printable(code):
            out.append(ch)
        elif code <= 0xFF:
            out.append(f"\\x{code:02x}")
        else:
            out.append(f"\\u{code:04x}")
    return "".join(out) + '"'


def _literal(value: Any, indent: int) -> str | None:
    """A multi-line string as a literal block (``|``), so a pod's script reads as the script it is; None
    where one cannot hold it as it is (a control character, a first line that starts with a blank)."""
    if not isinstance(value, str) or "\n" not in value or not value.strip("\n"):
        return None
    body = value.rstrip("\n")
    tail = len(value) - len(body)  # trailing newlines: chomping "-" (none) or "" (one); more stay quoted
    if tail > 1 or body.lstrip("\n")[0] in " \t" or not all(ch in "\n\t" or _printable(ord(ch)) for ch in set(body)):
        return None
    lines = [" " * indent + line if line else "" for line in body.split("\n")]
    return ("|-\n" if tail == 0 else "|\n") + "\n".join(lines)


def to_yaml(obj: Any, indent: int = 0) -> str:
    """Block-style YAML for dicts, lists and scalars; multi-line strings as literal blocks, other strings
    that need it double-quoted.

    Deterministic (insertion order), so rendered manifests can be golden files.
    """
    pad = " " * indent
    lines: list[str] = []
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            key = _scalar(str(k))
            if isinstance(v, (Mapping, list)) and v:
                lines.append(f"{pad}{key}:")
                lines.append(to_yaml(v, indent + 2).rstrip("\n"))
            elif isinstance(v, (Mapping, list)):
                lines.append(f"{pad}{key}: {'{}' if isinstance(v, Mapping) else '[]'}")
            else:
                lines.append(f"{pad}{key}: {_literal(v, indent + 2) or _scalar(v)}")
    elif isinstance(obj, list):
        for item in obj:
            if isinstance(item, (Mapping, list)) and item:
                inner = to_yaml(item, indent + 2).rstrip("\n")
                lines.append(f"{pad}- {inner[indent + 2 :]}")
            elif isinstance(item, (Mapping, list)):
                lines.append(f"{pad}- {{}}")
            else:
                lines.append(f"{pad}- {_literal(item, indent + 2) or _scalar(item)}")
    else:
        lines.append(pad + _scalar(obj))
    return "\n".join(lines) + "\n"
