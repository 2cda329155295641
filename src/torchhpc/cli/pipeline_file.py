"""A pipeline file (TOML) to checked steps, through ``torchhpc run``'s own flags.

::

    name = "mnist"                 # optional: the pipeline's name (default: the file's)
    [defaults]                     # optional: keys every step gets unless it sets them
    scheduler = "slurm"
    [steps.prep]
    program = ["prep.py", "--out", "data"]
    [steps.train]
    program = ["train.py"]
    nodes = 2
    nproc_per_node = 2
    after = ["prep"]               # after_any, after_fail as --after-any, --after-fail

A step's keys are ``run``'s flags, read from ``run``'s parser itself (``nproc_per_node`` or
``nproc-per-node`` for ``--nproc-per-node``; lists for repeatable flags, ``env``/``opt`` also as
tables), given to the same :func:`~torchhpc.cli.jobargs.spec_from_args` as ``run``'s command
line, so a step means exactly what ``torchhpc run`` with those flags means: no second option
parser. Every problem in the file is one line of one error; nothing is submitted until there
are none.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
from typing import Any

from torchhpc.cli.jobargs import add_job_arguments, exclude_nodes, spec_from_args
from torchhpc.core.suggest import did_you_mean
from torchhpc.errors import ConfigError, TorchHPCError, name_flag_as
from torchhpc.pipeline import STEP_KEYS, Step, check_graph, name_problem

__all__ = ["as_written", "load_pipeline", "step_keys"]

_TOP_KEYS = ("name", "defaults", "steps")
# dependencies name steps (after, after_any, after_fail), not job ids; -n is --nproc-per-node's short form
_NOT_STEP_KEYS = {"after_ok", "after_any", "after_fail", "nproc_short", "help"}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    add_job_arguments(p)
    return p


def step_keys() -> dict[str, argparse.Action]:
    """Key -> ``run``'s action: each flag's dest, and its long names with ``_`` or ``-``."""
    keys: dict[str, argparse.Action] = {}
    for action in _parser()._actions:
        if not action.option_strings or action.dest in _NOT_STEP_KEYS:
            continue
        keys[action.dest] = action
        for opt in action.option_strings:
            if opt.startswith("--"):
                keys.setdefault(opt[2:], action)
                keys.setdefault(opt[2:].replace("-", "_"), action)
    return keys


def _value(key: str, value: Any, action: argparse.Action) -> Any:
    """``value`` as argparse would have stored it for that flag; ValueError says why not."""
    if action.nargs == 0:  # store_true
        if not isinstance(value, bool):
            raise ValueError(f"{key} = {value!r} is not true or false")
        return value
    if isinstance(action, argparse._AppendAction):
        if isinstance(value, dict):  # env = {A = "1"}, opt = {constraint = "a100"}
            return [f"{k}={_scalar(key, v)}" for k, v in value.items()]
        items = value if isinstance(value, list) else [value]
        return [_scalar(key, v) for v in items]
    if action.type is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{key} = {value!r} is not a whole number")
        return value
    if callable(action.type) and action.type is not str:  # a flag's own parser (--nodes 2-4, --signal-before 5m)
        try:
            return action.type(_scalar(key, value))
        except argparse.ArgumentTypeError as e:
            raise ValueError(f"{key} = {e}") from None
    text = _scalar(key, value)
    if action.choices is not None and text not in action.choices:
        raise ValueError(f"{key} = {text!r} is not one of: {', '.join(map(str, action.choices))}")
    return text


def _scalar(key: str, value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"{key} = {value!r} is not a string")
    return str(value)


def _program(value: Any) -> list[str]:
    if isinstance(value, str):
        return shlex.split(value)
    if isinstance(value, list) and all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in value):
        return [str(v) for v in value]
    raise ValueError(f"program = {value!r} is not a list of words (or one string)")


def _names(key: str, value: Any) -> list[str]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(v, str) for v in items):
        raise ValueError(f"{key} = {value!r} is not a list of step names")
    return items


def _step(name: str, table: dict[str, Any], keys: dict[str, argparse.Action], source: str,
          problems: list[str], dry_run: bool) -> tuple[list[tuple[str, str]], Step | None]:
    where = f"{source}: step {name}"
    ns = _parser().parse_args([])
    ns.dry_run = dry_run
    program: list[str] = []
    after: list[tuple[str, str]] = []
    by_key = {v: k for k, v in STEP_KEYS.items()}
    before = len(problems)
    for key, value in table.items():
        try:
            if key == "program":
                program = _program(value)
            elif key in by_key or key == "after_ok":
                after += [(by_key.get(key, "ok"), n) for n in _names(key, value)]
            elif key in keys:
                action = keys[key]
                converted = _value(key, value, action)
                if action.dest == "exclude":  # --exclude NODES|@FILE is the scheduler option exclude=
                    ns.opt = [*ns.opt, "exclude=" + exclude_nodes(str(converted))]
                elif isinstance(action, argparse._AppendAction):
                    setattr(ns, action.dest, [*(getattr(ns, action.dest) or []), *converted])
                else:
                    setattr(ns, action.dest, converted)
            else:
                hint = did_you_mean(key, [*keys, "program", *by_key])
                problems.append(f"{where}: unknown key {key!r}" + (f" ({hint})" if hint else ""))
        except ValueError as e:
            problems.append(f"{where}: {e}")
        except TorchHPCError as e:
            problems.append(f"{where}: {e.message}")
    if not program and not getattr(ns, "module", None):
        problems.append(f"{where}: no program (add program = [\"script.py\", \"--arg\", ...])")
    if len(problems) > before:
        return after, None
    if ns.name is None:
        ns.name = name
    try:
        spec = spec_from_args(ns, program)
        from torchhpc.schedulers import scheduler_class
        from torchhpc.schedulers.capabilities import check

        check(scheduler_class(spec.scheduler), spec)  # what its scheduler refuses, named by the file's key
    except TorchHPCError as e:
        problems.append(f"{where}: {as_written(e.message, table, keys)}")
        return after, None
    return after, Step(name, spec, tuple(after))


def as_written(message: str, table: dict[str, Any], keys: dict[str, argparse.Action]) -> str:
    """``message`` (``run``'s words: ``--partition 'p\\nx' contains ...``) with each flag the step set
    named by the key the file gives it (``partition = 'p\\nx' contains ...``), tables as ``opt.KEY``."""
    for key in table:
        action = keys.get(key)
        if action is None:
            continue
        for flag in sorted((o for o in action.option_strings if o.startswith("--")), key=len, reverse=True):
            if isinstance(table[key], dict):  # env = {A = "1"} -> "--env A" reads env.A
                at = rf"(?<![\w-]){re.escape(flag)}(?![\w-])"
                message = re.sub(at + r" (\w+)", key + r".\1 =", message)  # key: one of run's, no backslash
            message = name_flag_as(message, flag, key, " = ")
    return message


def load_pipeline(path: str, *, dry_run: bool = False) -> tuple[str, list[Step]]:
    """The pipeline's name and steps, each problem in the file one line of one :class:`ConfigError`."""
    from torchhpc.profiles import _toml_loads

    try:
        with open(path, encoding="utf-8") as f:
            data = _toml_loads(f.read(), path)
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror}", "give the pipeline's .toml file") from None
    problems = [f"{path}: unknown top-level key {k!r} (keys: name, [defaults], [steps.NAME])"
                for k in data if k not in _TOP_KEYS]
    name = data.get("name") or os.path.splitext(os.path.basename(path))[0]
    defaults = data.get("defaults") or {}
    steps_table = data.get("steps") or {}
    if not isinstance(defaults, dict) or not isinstance(steps_table, dict) or not isinstance(name, str):
        raise ConfigError(f"{path}: name is a string, [defaults] a table and [steps.NAME] tables",
                          "see docs/pipelines.md for the layout")
    if not steps_table:
        raise ConfigError(f"{path} has no steps", 'add [steps.NAME] tables, each with program = ["script.py"]')
    keys = step_keys()
    steps: list[Step] = []
    graph: dict[str, list[tuple[str, str]]] = {}
    for step_name, table in steps_table.items():
        if not isinstance(table, dict):
            problems.append(f"{path}: steps.{step_name} is not a table")
            continue
        if name_problem(step_name, path):  # check_graph says so, once; its job is not built under that name
            graph[step_name] = []
            continue
        graph[step_name], step = _step(step_name, {**defaults, **table}, keys, path, problems, dry_run)
        if step is not None:
            steps.append(step)
    # a step that could not be built still has the scheduler its table names, for the check across schedulers
    schedulers: dict[str, str | None] = {
        name: (t if isinstance(t := {**defaults, **steps_table[name]}.get("scheduler"), str) else None) for name in graph
    }
    schedulers.update({s.name: s.spec.scheduler for s in steps})
    problems += check_graph(graph, schedulers, path)[0]  # names and cycles, also of steps with bad options
    if problems:
        raise ConfigError("\n".join(problems), "fix the lines above; nothing was submitted")
    return name, steps
