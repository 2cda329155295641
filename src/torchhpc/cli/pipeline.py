"""``torchhpc pipeline FILE.toml``: named steps submitted at once, chained by native dependencies.

parse the file through ``run``'s flags (:mod:`torchhpc.cli.pipeline_file`) -> check (cycles,
unknown names, bad options: one line each) -> :func:`torchhpc.pipeline.submit` -> the step table.
``status``, ``cancel`` and ``logs`` work on the pipeline as a whole.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from torchhpc.cli.common import Progress, add_subparser, eprint, json_errors
from torchhpc.errors import ConfigError, TorchHPCError, UsageError

DESCRIPTION = """Submit a pipeline: named steps, each a job as `torchhpc run` takes it, chained by
`after = ["step"]` (after_any, after_fail as --after-any, --after-fail).

Every step is submitted at once, with native dependencies (Slurm --dependency, PBS -W depend,
the local supervisor's wait), so nothing has to stay running here. The file is checked first:
cycles, unknown step names and bad options each get one line, and nothing is submitted until
there are none. The pipeline's record (PIPELINE-ID.pipeline.json) goes to the output directory
of [defaults] (default: here); status, cancel and logs find it by the .toml file, the record or
the pipeline id. A step whose dependency failed shows NEVER: it will not run. See docs/pipelines.md.

forms:
  torchhpc pipeline FILE.toml [--dry-run] [--wait] [--json]   check, then submit every step
  torchhpc pipeline status FILE|ID [--wait] [--json]          the step table (one query per scheduler)
  torchhpc pipeline cancel FILE|ID [STEP]                     cancel STEP and every step after it (all without STEP)
  torchhpc pipeline logs FILE|ID STEP [--rank N]              one step's log
"""

EXAMPLES = """examples:
  torchhpc pipeline examples/pipeline.toml --dry-run
  torchhpc pipeline examples/pipeline.toml
  torchhpc pipeline status examples/pipeline.toml
  torchhpc pipeline cancel examples/pipeline.toml prep
  torchhpc pipeline logs examples/pipeline.toml train --rank 0
"""

ACTIONS = ("status", "cancel", "logs")


def register(sub: Any) -> None:
    p = add_subparser(sub, "pipeline", "submit named steps chained by dependencies; status, cancel, logs", DESCRIPTION)
    p.epilog = EXAMPLES
    p.add_argument("words", nargs="+", metavar="FILE|ACTION ...", help="FILE.toml, or status|cancel|logs and their arguments")
    p.add_argument("--dry-run", action="store_true", help="check the file and print every step's render; submit nothing")
    p.add_argument("--wait", action="store_true", help="wait until every step has ended, then print the table")
    p.add_argument("--rank", type=int, default=None, help="logs: only this rank's lines")
    p.add_argument("--json", action="store_true", help="machine-readable output: the steps, or the error")
    p.set_defaults(func=cmd_pipeline)


@json_errors
def cmd_pipeline(args: argparse.Namespace) -> int:
    words = list(args.words)
    if words[0] in ACTIONS:
        action, rest = words[0], words[1:]
        if not rest:
            raise UsageError(f"pipeline {action} needs the pipeline", f"torchhpc pipeline {action} FILE.toml (or its id)")
        return {"status": _status, "cancel": _cancel, "logs": _logs}[action](args, rest)
    if len(words) != 1:
        from torchhpc.core.suggest import did_you_mean

        near = did_you_mean(words[0], ACTIONS) if not words[0].endswith(".toml") else ""
        if near:
            raise UsageError(f"pipeline: {words[0]!r} is not an action", f"{near} (status, cancel or logs)")
        raise UsageError(f"pipeline takes one file, not {' '.join(words)}",
                         "torchhpc pipeline FILE.toml, or pipeline status|cancel|logs FILE ...")
    return _submit(args, words[0])


def _submit(args: argparse.Namespace, path: str) -> int:
    from torchhpc import pipeline
    from torchhpc.cli.pipeline_file import load_pipeline

    name, steps = load_pipeline(path, dry_run=args.dry_run)
    if args.dry_run:
        _check_here(path, steps)
        rendered = pipeline.render(steps)
        if args.json:
            print(json.dumps([{"step": s.name, "scheduler": sub.scheduler, "argv": list(sub.argv), "script": sub.script,
                               "after": [list(a) for a in s.after]} for s, sub in rendered], indent=1))
            return 0
        sys.stdout.write(_summary(name, steps))
        for step, sub in rendered:
            sys.stdout.write(f"# ===== step {step.name} =====\n{sub}")
        return 0
    directory = steps[0].spec.output_dir if len({s.spec.output_dir for s in steps}) == 1 else "."
    rec = pipeline.submit(steps, name=name, file=path, directory=directory)
    eprint(f"Submitted pipeline {rec.id} ({len(rec.steps)} steps); record: {rec.path}")
    return _show(args, rec)


def _check_here(path: str, steps: Sequence[Any]) -> None:
    """A dry run refuses what the run would: a local step's program that is not there (a cluster's step may
    run files that exist only on the cluster: checked when it is submitted)."""
    from torchhpc.job import check_program
    from torchhpc.schedulers import scheduler_class

    for step in steps:
        if scheduler_class(step.spec.scheduler).runs_here:
            try:
                check_program(step.spec)
            except TorchHPCError as e:
                raise ConfigError(f"{path}: step {step.name}: {e.message}", e.hint) from None


def _summary(name: str, steps: Sequence[Any]) -> str:
    """The graph in a few lines before the scripts: each step, its scheduler and what it waits for."""
    lines = [f"# pipeline {name}: {len(steps)} {'step' if len(steps) == 1 else 'steps'}"]
    for step in steps:
        after = ", ".join(f"{n} ({kind})" for kind, n in step.after)
        lines.append(f"#   {step.name} on {step.spec.scheduler}" + (f", after {after}" if after else ", first"))
    return "\n".join(lines) + "\n"


def _show(args: argparse.Namespace, rec: Any) -> int:
    from torchhpc import pipeline

    if args.wait:
        progress = Progress()
        while True:
            rows = pipeline.rows(rec)
            if all(r.state in ("NEVER", "UNKNOWN") or (r.status is not None and r.status.terminal) for r in rows):
                break
            progress.update(" ".join(f"{r.step}={r.state}" for r in rows))
            time.sleep(2)
        progress.done()
    else:
        rows = pipeline.rows(rec)
    if args.json:
        print(json.dumps({"id": rec.id, "name": rec.name, "record": rec.path, "steps": [
            {"step": r.step, "handle": r.handle, "state": r.state, "detail": r.detail, "after": r.after} for r in rows]}))
    else:
        sys.stdout.write(pipeline.table(rows))
    if args.wait:
        return 0 if all(r.state == "COMPLETED" for r in rows) else 1
    return 1 if any(r.state == "UNKNOWN" for r in rows) else 0  # a step nobody can answer for is no success


def _status(args: argparse.Namespace, rest: list[str]) -> int:
    from torchhpc import pipeline

    if len(rest) != 1:
        raise UsageError("pipeline status takes one pipeline", "torchhpc pipeline status FILE.toml (or its id)")
    return _show(args, pipeline.find_record(rest[0]))


def _cancel(args: argparse.Namespace, rest: list[str]) -> int:
    from torchhpc import pipeline

    if len(rest) > 2:
        raise UsageError("pipeline cancel takes the pipeline and at most one step", "torchhpc pipeline cancel FILE [STEP]")
    rec = pipeline.find_record(rest[0])
    for step, what in pipeline.cancel(rec, rest[1] if len(rest) > 1 else None):
        print(f"{step}: {what}")
    return 0


def _logs(args: argparse.Namespace, rest: list[str]) -> int:
    from torchhpc import pipeline

    if len(rest) != 2:
        raise UsageError("pipeline logs takes the pipeline and one step", "torchhpc pipeline logs FILE.toml STEP [--rank N]")
    sys.stdout.write(pipeline.logs(pipeline.find_record(rest[0]), rest[1], rank=args.rank))
    return 0
