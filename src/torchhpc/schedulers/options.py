"""Typed scheduler options: what ``--opt KEY=VALUE`` accepts, per backend, listable.

Each backend declares its options as :class:`Option` values (name, type,
default, help); ``torchhpc options NAME`` prints them and :func:`resolve`
checks a job's options once for every backend: an unknown name or a value of
the wrong type is one error that names the value, where it came from, and the
valid choices. Values stay the text the user gave (the job description keeps
strings), so a checked option renders exactly as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from torchhpc.core.units import parse_switch, plural
from torchhpc.errors import SpecError

__all__ = ["Option", "declare", "options_table", "resolve", "with_defaults"]


@dataclass(frozen=True)
class Option:
    """One ``--opt`` key. ``type`` is ``str``, ``int`` (a whole number >= 0), ``bool``
    (1/0, true/false, yes/no, on/off) or ``choice`` (one of ``choices``)."""

    name: str
    help: str
    type: str = "str"
    default: str | None = None
    choices: tuple[str, ...] = ()

    def resolve(self, value: str, scheduler: str) -> str:
        """``value`` if it has this option's type, else :class:`SpecError`."""
        ok = True
        if self.type == "int":
            ok = value.strip().isdigit()
        elif self.type == "bool":
            parse_switch(value, f"{self.name} (from --opt)")
        elif self.type == "choice":
            ok = value in self.choices
        if not ok:
            want = {"int": "a whole number", "bool": "1 or 0 (true/false, yes/no)"}.get(
                self.type, "one of " + ", ".join(self.choices)
            )
            raise SpecError(
                f"{self.name}={value!r} (from --opt) is not {want}",
                f"`torchhpc options {scheduler}` describes {self.name}",
            )
        return value

    @property
    def kind(self) -> str:
        return "|".join(self.choices) if self.type == "choice" else self.type


def resolve(scheduler: str, declared: Iterable[Option], given: Mapping[str, str]) -> dict[str, str]:
    """Check ``given`` against ``declared``: one error for unknown names, one per ill-typed value."""
    table = {o.name: o for o in declared}
    unknown = sorted(set(given) - set(table))
    if unknown:
        raise SpecError(
            f"unknown {scheduler} {plural(len(unknown), 'option')} {', '.join(unknown)} (from --opt)",
            f"valid: {', '.join(table)}; `torchhpc options {scheduler}` describes them",
        )
    return {k: table[k].resolve(v, scheduler) for k, v in given.items()}


def with_defaults(declared: Iterable[Option], given: Mapping[str, str]) -> dict[str, str]:
    """``given`` over the declared defaults: a default is written once, in its :class:`Option`."""
    return {**{o.name: o.default for o in declared if o.default is not None}, **given}


def options_table(declared: Iterable[Option]) -> list[str]:
    """``torchhpc options``' lines: name, type, default, help."""
    rows = [(o.name, o.kind, o.default if o.default is not None else "-", o.help) for o in declared]
    if not rows:
        return []
    head = ("option", "type", "default")
    w = [max(len(r[i]) for r in (head, *rows)) for i in range(3)]
    lines = [f"  {head[0]:<{w[0]}}  {head[1]:<{w[1]}}  {head[2]:<{w[2]}}  what"]
    lines += [f"  {n:<{w[0]}}  {t:<{w[1]}}  {d:<{w[2]}}  {h}" for n, t, d, h in rows]
    return lines


def declare(*options: Option) -> dict[str, Option]:
    """A backend's ``OPTIONS`` table, by name."""
    return {o.name: o for o in options}
