"""``torchhpc env``: what this process would be told about its place in the job.

Run it inside a task (``srun torchhpc env``, ``mpirun torchhpc env``, in a pod)
to see the rank, world and master every rank would use; ``--explain`` shows
each detector's verdict and why; ``--export`` prints ``export`` lines for
``eval`` (only for variables not already set: the user's values win).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping
from typing import Any

from torchhpc.cli.common import add_subparser
from torchhpc.core.shell import export_lines
from torchhpc.env import PRIORITY, DistEnv, Verdict, detect, explain, export
from torchhpc.env.compat import disagreements

FIELDS = (
    "source",
    "scheduler",
    "job_id",
    "rank",
    "world_size",
    "local_rank",
    "local_world_size",
    "node_rank",
    "num_nodes",
    "master_addr",
    "master_port",
)


def register(sub: Any) -> None:
    p = add_subparser(
        sub,
        "env",
        "show the distributed environment detected in this process (rank, world, master)",
        description=__doc__,
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--explain", action="store_true", help="every detector's verdict, in priority order, and why")
    mode.add_argument(
        "--export",
        action="store_true",
        help="print `export NAME=value` lines of torch's env contract (unset variables only); "
        'use as eval "$(torchhpc env --export)"',
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_env)


def render_env(dist_env: DistEnv) -> list[str]:
    values = dist_env.as_dict()
    width = max(len(f) for f in FIELDS)
    lines = [f"{name:<{width}}  {'-' if values[name] is None else values[name]}" for name in FIELDS]
    lines += [f"{'note':<{width}}  {note}" for note in dist_env.notes]
    return lines


def seen_variables(verdicts: list[Verdict], environ: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """Per detector, the variables it reads that are set here (the evidence behind its verdict)."""
    reads = {detector.name: detector.variables for detector, _ in PRIORITY}
    return {v.name: {n: environ[n] for n in reads.get(v.name, ()) if n in environ} for v in verdicts}


def render_explain(verdicts: list[Verdict], environ: Mapping[str, str] | None = None) -> list[str]:
    lines: list[str] = []
    if verdicts and verdicts[-1].chosen:  # the fallback (last) chose: said first, the table below is the why
        lines.append("not inside a distributed job: no launcher's or scheduler's variables are set, so this is one "
                     "process (rank 0 of 1). The detectors, in the order they are tried:")
    width = max(len(v.name) for v in verdicts)
    seen = seen_variables(verdicts, os.environ if environ is None else environ)
    for i, v in enumerate(verdicts, 1):
        mark = "chosen " if v.chosen else ("match  " if v.matched else "no     ")
        lines.append(f"{i:>2}. {v.name:<{width}}  {mark} {v.reason}")
        if seen[v.name]:
            # repr() keeps a hostile value on one line of this report.
            shown = ", ".join(f"{n}={val!r}" if not val.isprintable() else f"{n}={val}" for n, val in seen[v.name].items())
            lines.append(f"    {'':<{width}}  read    {shown}")
        if v.error is not None:
            lines.append(f"    {'':<{width}}  error   {v.error}")
        elif v.matched and v.env is not None:
            e = v.env
            lines.append(
                f"    {'':<{width}}  gives   rank {e.rank}/{e.world_size}, local {e.local_rank}/{e.local_world_size}, "
                f"node {e.node_rank}/{e.num_nodes}, master {e.master_addr}:{e.master_port}"
            )
        lines.append(f"    {'':<{width}}  why #{i}: {v.priority_reason}")
    chosen = next((v for v in verdicts if v.chosen and v.env is not None), None)
    if chosen is not None and chosen.env is not None:
        lines += render_disagreements(chosen.env, os.environ if environ is None else environ)
    return lines


def render_disagreements(dist_env: DistEnv, environ: Mapping[str, str]) -> list[str]:
    """Variables other frameworks read that name another rank or world than the chosen one."""
    found = disagreements(dist_env, environ)
    if not found:
        return []
    lines = ["", f"variables that disagree with rank {dist_env.rank} of {dist_env.world_size} ({dist_env.source}):"]
    lines += [f"  {d.message}" for d in found]
    hints = dict.fromkeys(d.hint for d in found)
    lines += [f"  HINT: {h}" for h in hints]
    return lines


def cmd_env(args: argparse.Namespace) -> int:
    if args.explain:
        verdicts = explain()
        if args.json:
            seen = seen_variables(verdicts, os.environ)
            print(json.dumps([{**v.as_dict(), "read": seen[v.name]} for v in verdicts], indent=2))
        else:
            print("\n".join(render_explain(verdicts)))
        chosen = next(v for v in verdicts if v.chosen)
        if chosen.error is not None:
            raise chosen.error
        return 0
    dist_env = detect()
    if args.export:
        environ = dict(os.environ)
        added = export(dist_env, environ)
        kept = [name for name in dist_env.as_torch_env() if name not in added]
        if args.json:
            print(json.dumps({"export": added, "kept": {k: os.environ[k] for k in kept}}, indent=2))
            return 0
        # Names only in comments: a value with a newline would end the comment and run as code.
        for name in kept:
            print(f"# keeping {name} (already set)")
        lines = export_lines(added)
        if lines:
            print("\n".join(lines))
        return 0
    if args.json:
        print(json.dumps(dist_env.as_dict(), indent=2))
    else:
        print("\n".join(render_env(dist_env)))
    return 0


__all__ = ["FIELDS", "PRIORITY", "cmd_env", "register", "render_disagreements", "render_env", "render_explain"]
