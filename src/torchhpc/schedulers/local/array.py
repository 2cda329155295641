"""Job arrays on the local scheduler: the tasks one after another, or ``%K`` at a time.

Each task is an ordinary local run of its own (its own free MASTER_PORT and run id),
with ``TORCHHPC_ARRAY_INDEX``/``TORCHHPC_ARRAY_COUNT`` in its environment and
``{index}`` (and a sweep's ``{NAME}``) replaced in the program's arguments -- in
Python, argument by argument, so a value reaches the program exactly. Every output
line is prefixed ``[task I]`` before the rank's own ``[rankN]:``.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import IO, TYPE_CHECKING, Any, Optional, cast

from torchhpc.core.array import substitute
from torchhpc.core.spec import JobSpec
from torchhpc.errors import JobFailed
from torchhpc.jobdir.logs import TASK_END

if TYPE_CHECKING:
    from torchhpc.schedulers.api import Submission

__all__ = ["TASK_END", "run_array", "task_spec"]


def task_spec(spec: JobSpec, index: int) -> JobSpec:
    """The job one array task runs: no array, its index in the env and the arguments."""
    arr = spec.array_spec
    assert arr is not None
    pos = arr.indices.index(index)
    values = {"index": str(index), **{name: vals[pos] for name, vals in spec.array_params}}
    entry = replace(spec.entrypoint, args=tuple(substitute(spec.entrypoint.args, values)))
    env = (*spec.env, ("TORCHHPC_ARRAY_INDEX", str(index)), ("TORCHHPC_ARRAY_COUNT", str(arr.count)))
    return spec.with_(array=None, array_params=(), entrypoint=entry, env=env)


class _Prefixed:
    """A text stream that prefixes every line (shared by tasks running at once: one lock)."""

    def __init__(self, out: IO[str], prefix: str, lock: threading.Lock) -> None:
        self.out, self.prefix, self.lock, self.partial = out, prefix, lock, ""

    def write(self, text: str) -> int:
        lines = (self.partial + text).split("\n")
        self.partial = lines.pop()
        if lines:
            with self.lock:
                self.out.write("".join(f"{self.prefix}{line}\n" for line in lines))
        return len(text)

    def flush(self) -> None:
        with self.lock:
            if self.partial:
                self.out.write(self.prefix + self.partial)
                self.partial = ""
            self.out.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.out, name)


def run_array(run_task: Callable[[JobSpec, IO[str], IO[str]], object], submission: Submission, *,
              stdout: Optional[IO[str]] = None, stderr: Optional[IO[str]] = None) -> int:
    """Run every task; 0 when all succeeded, else :class:`JobFailed` naming the failed tasks.

    ``run_task(spec, stdout, stderr)`` runs one task's job (the local scheduler's own run):
    passed in, so this module never imports the scheduler back."""
    spec = submission.spec
    arr = spec.array_spec
    assert arr is not None
    out, err = stdout or sys.stdout, stderr or sys.stderr
    lock = threading.Lock()
    failed: dict[int, int] = {}
    reasons: dict[int, str] = {}

    def one(index: int) -> None:
        o = _Prefixed(out, f"[task {index}] ", lock)
        e = _Prefixed(err, f"[task {index}] ", lock)
        t0 = time.monotonic()
        try:
            run_task(task_spec(spec, index), cast(IO[str], o), cast(IO[str], e))
        except JobFailed as ex:
            failed[index] = ex.exit_code or 1
            reasons[index] = str(ex.message).splitlines()[0] if ex.message else ""
        finally:
            o.flush()
            # each task's own end, as Slurm's accounting keeps it per array task (`sweep status` reads it)
            state = "FAILED" if index in failed else "COMPLETED"
            e.write(TASK_END.format(index=index, state=state, code=failed.get(index, 0), s=time.monotonic() - t0,
                                    reason=f": {reasons[index]}" if reasons.get(index) else "") + "\n")
            e.flush()

    with ThreadPoolExecutor(max_workers=arr.parallel or 1) as pool:
        list(pool.map(one, arr.indices))
    if failed:
        names = ", ".join(f"{i} (exit {c})" for i, c in sorted(failed.items()))
        raise JobFailed(
            f"{len(failed)} of {arr.count} array tasks failed: {names}",
            "each task's lines are prefixed [task I]; rerun one with --array I",
            returncode=next(iter(sorted(failed.items())))[1],
        )
    return 0
