"""A local background job's supervisor process: ``python -m torchhpc.supervisor.background DIR``.

``torchhpc run --background`` (and ``Job(...).submit()`` on the local scheduler) starts this in
its own session. It runs the job kept in ``DIR`` through the local scheduler (the registry's,
:meth:`~torchhpc.schedulers.local.local.LocalScheduler.run_background`), each attempt through
:class:`~torchhpc.supervisor.restarts.Restarts`: ``--max-restarts`` and ``--hang-timeout`` are
applied here, in the job's own process, with no client waiting.

It lives with the supervisor, not with the local backend, because it reads the verdict and the
hang watch (:mod:`torchhpc.diagnose`), a layer above the schedulers (tests/unit/test_layers.py).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Optional

from torchhpc.schedulers import get_scheduler
from torchhpc.schedulers.api import Submission
from torchhpc.supervisor.restarts import Restarts

__all__ = ["attempts_for", "main"]


def attempts_for(d: Path, submission: Submission) -> Restarts:
    """The attempts of the job in ``d``: its ``--max-restarts``, and its ``--hang-timeout`` watch
    (the same watch `torchhpc wait` would run, diagnose.hang.watch_job)."""
    from torchhpc.jobdir.record import read_record

    spec = submission.spec
    log = read_record(spec.scheduler, d.name).output_path  # output.log: every rank's lines, prefixed [rankN]:
    watch = None
    if spec.hang_timeout:
        from torchhpc.diagnose.hang import HangWatch, watch_job

        timeout = float(spec.hang_timeout)

        def say(text: str) -> None:
            print(text, file=sys.stderr, flush=True)

        def watch(act: Callable[[str], None]) -> Optional[HangWatch]:
            return watch_job(get_scheduler(spec.scheduler), d.name, timeout, "cancel", act, say)
    return Restarts(max_restarts=spec.max_restarts, job_dir=str(d), log_path=log, watch=watch,
                    max_no_progress=spec.max_no_progress, checkpoint_dir=spec.checkpoint_dir,
                    on_restart_append=spec.on_restart_append)


def main(argv: list[str]) -> int:
    sched = get_scheduler("local")
    run_background: Callable[..., int] = getattr(sched, "run_background")  # noqa: B009 (the local backend's own)
    return run_background(argv[0], attempts_for)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
