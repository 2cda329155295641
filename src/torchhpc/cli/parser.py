"""argparse with short errors that find the fix: "did you mean" and a one-line usage.

argparse answers a typo (``--nodse 2``) with the whole usage (19 lines for ``run``) and
"unrecognized arguments". Here an unknown flag or subcommand gets the nearest known ones
(:mod:`torchhpc.core.suggest`, edit distance as git and cargo) and one usage line that points
at ``--help``. Every subparser inherits the class (``add_subparsers`` uses ``type(self)``).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from torchhpc.core.suggest import did_you_mean

__all__ = ["Parser", "print_json_error"]

# Error-path patterns as text: re compiles (and caches) them when an error needs one, not at every start.
_CHOICE = r"argument (?P<arg>\S+): invalid choice: '(?P<word>[^']*)' \(choose from (?P<known>.*)\)$"


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are at most three lines: the error, the nearest names, usage."""

    #: The one usage line, where the computed one would say too little (``run``'s program).
    short_usage: str | None = None
    #: Set by ``main`` when the command line asks for ``--json``: the error is then a JSON object on stdout,
    #: like every other error of a ``--json`` command (cli/common.py ``json_errors``).
    json_errors: bool = False
    #: Text made only when the help is shown, appended to the epilog (``run``'s exit-code table: wrapping it
    #: loads textwrap, which a submission does not need).
    epilog_more: Callable[[], str] | None = None

    def format_help(self) -> str:
        if self.epilog_more is not None:
            self.epilog, self.epilog_more = (self.epilog or "") + self.epilog_more(), None
        return super().format_help()

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:  # type: ignore[override]
        argv = list(sys.argv[1:] if args is None else args)
        ns, extras = self.parse_known_args(argv, namespace)
        if extras:
            owner = self._owner(argv)
            # `config --json show`: a switch of the subcommand written before its name; taken as meant
            switches = {o for act in owner._actions if act.nargs == 0 for o in act.option_strings}
            if owner is not self and set(extras) <= switches:
                ns, again = self.parse_known_args([w for w in argv if w not in extras] + extras, namespace)
                if not again:
                    return ns
            owner.error(owner.unknown_message(extras))
        return ns

    def _owner(self, argv: list[str]) -> Parser:
        """The (sub)command parser the words belong to: the deepest subcommand named on the line."""
        parser: Parser = self
        for word in argv:
            sub = parser._subcommands()
            if sub is not None and word in sub.choices and isinstance(sub.choices[word], Parser):
                parser = sub.choices[word]
        return parser

    def _subcommands(self) -> argparse._SubParsersAction[Any] | None:
        return next((a for a in self._actions if isinstance(a, argparse._SubParsersAction)), None)

    def _flags(self) -> list[str]:
        return [o for a in self._actions for o in a.option_strings if o.startswith("--")]

    def unknown_message(self, extras: list[str]) -> str:
        flags = [w for w in extras if w.startswith("-") and w != "-"]
        if flags:
            word = flags[0].split("=", 1)[0]
            near = did_you_mean(word, self._flags())
            more = f" (and {len(flags) - 1} more)" if len(flags) > 1 else ""
            spelled = _native(word)  # a Slurm user's habit (-p, -J, --exclusive): torchhpc's name for it
            if spelled:
                return f"unknown flag {word}{more}: {spelled}"
            return f"unknown flag {word}{more}" + (f": {near}" if near else "")
        sub = self._subcommands()
        if sub is not None:
            near = did_you_mean(extras[0], sub.choices)
            return f"unknown command {extras[0]!r}" + (f": {near}" if near else "")
        return f"unexpected argument {extras[0]!r}"

    def one_line_usage(self) -> str:
        if self.short_usage:
            return self.short_usage
        words = [self.prog]
        if any(a.option_strings and a.dest != "help" for a in self._actions):
            words.append("[FLAGS]")
        for a in self._actions:
            if not a.option_strings and a.help != argparse.SUPPRESS:
                name = a.metavar if isinstance(a.metavar, str) else a.dest.upper()
                if a.nargs in ("*", "?"):
                    name = f"[{name}{' ...' if a.nargs == '*' else ''}]"
                words.append(name + (" ..." if isinstance(a, argparse._SubParsersAction) else ""))
        return "usage: " + " ".join(words)

    def error(self, message: str) -> NoReturn:
        m = re.match(_CHOICE, message)
        if m:  # a mistyped subcommand or choice: name the nearest, not all of them
            known = re.findall(r"'([^']*)'", m.group("known"))
            near = did_you_mean(m.group("word"), known)
            sub = self._subcommands()
            if sub is not None and m.group("arg") in (sub.metavar, sub.dest):
                message = f"unknown command {m.group('word')!r}: "
            else:
                message = f"{m.group('arg')} {m.group('word')!r} is not one of its choices: "
            message += near or f"choose from {', '.join(known)}"
        message = _plain_required(_plain_value(message))
        hint = f"{self.one_line_usage()}  (`{self.prog} --help` says more)"
        if Parser.json_errors:
            print_json_error(f"{self.prog}: {message}", hint, 2)
            self.exit(2)
        # the same two lines as every other error of the CLI (cli/main.py): Error: ..., HINT: ...
        self.exit(2, f"Error: {self.prog}: {message}\nHINT: {hint}\n")


def _native(word: str) -> str | None:
    """``that is sbatch's; here it is --partition NAME (...)`` for a scheduler's own submit flag, else None."""
    from torchhpc.schedulers import scheduler_class, scheduler_names

    for name in scheduler_names():
        try:
            cls = scheduler_class(name)
        except Exception:  # a backend this build lacks: it has no flags to name
            continue
        spelled = cls.native_flag(word)
        if spelled:
            return f"that is {cls.submit_command}'s; here it is {spelled} (`torchhpc options {name}`)"
    return None


def print_json_error(message: str, hint: str | None, exit_code: int) -> None:
    """An error of a ``--json`` command: one JSON object on stdout, the one shape every path prints
    (a parse error here, a command's error in cli/main.py and cli/common.py's ``json_errors``)."""
    import json

    print(json.dumps({"error": message, "hint": hint, "exit_code": exit_code}), flush=True)


_BAD_VALUE = r"^argument (?P<flag>[^:]+): invalid (?P<kind>int|float) value: (?P<value>.*)$"


def _plain_value(message: str) -> str:
    """argparse's "argument -n: invalid int value: 'two'" in the CLI's own words: "-n 'two' is not a whole number"."""
    m = re.match(_BAD_VALUE, message)
    if not m:  # a type's own words about the value ('2-4' is Slurm's min-max...): the flag, then them
        own = re.match(r"^argument (?P<flag>[^:]+): (?P<rest>'.*)$", message)
        return f"{own.group('flag').split('/')[-1]} {own.group('rest')}" if own else message
    what = "a whole number" if m.group("kind") == "int" else "a number"
    return f"{m.group('flag').split('/')[-1]} {m.group('value')} is not {what}"


def _plain_required(message: str) -> str:
    """argparse's "the following arguments are required: job" in the words of the usage line (JOB)."""
    head = "the following arguments are required: "
    if not message.startswith(head):
        return message
    names = [n.strip() for n in message[len(head):].split(",")]
    return "missing " + ", ".join(n if n.startswith("-") else n.upper() for n in names)
