"""The background supervisor of a local job: ``python -m torchhpc.schedulers.local.supervise DIR``.

Its own module, above both :mod:`~torchhpc.schedulers.local.local` (which runs the ranks)
and :mod:`~torchhpc.schedulers.local.jobs` (which starts it and reads its record),
so that neither of those imports the other back.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import time
from pathlib import Path

from torchhpc.errors import JobFailed
from torchhpc.schedulers.api import Submission
from torchhpc.schedulers.local.jobs import SUBMISSION, read_state, write_state
from torchhpc.schedulers.local.local import LocalScheduler

__all__ = ["supervise"]


def supervise(d: Path) -> int:
    """The background supervisor: run the submission, record how it ended."""
    def cancelled_early(signum: int, frame: object) -> None:
        raise JobFailed(f"interrupted by {signal.Signals(signum).name} before the ranks started", returncode=128 + signum)

    # Until the runner installs its own handlers (and after it restores this one).
    signal.signal(signal.SIGTERM, cancelled_early)
    with open(d / SUBMISSION, "rb") as f:
        submission: Submission = pickle.load(f)
    rec = read_state(d)
    rec.update(state="RUNNING", pid=os.getpid(), started=time.time())
    write_state(d, rec)
    os.chdir(str(rec.get("cwd") or "."))
    state, code, reason = "COMPLETED", 0, ""
    try:
        LocalScheduler().run(submission, run_id="local-" + d.name, stdout=sys.stdout, stderr=sys.stdout)
    except JobFailed as e:
        state = "CANCELLED" if e.message.startswith("interrupted") else "FAILED"
        code, reason = e.exit_code, e.message
        print(f"torchhpc: {e.message}", file=sys.stderr, flush=True)
    except Exception as e:  # recorded, never left as RUNNING
        state, code, reason = "FAILED", 1, f"{type(e).__name__}: {e}"
        print(f"torchhpc: {reason}", file=sys.stderr, flush=True)
    rec = read_state(d)
    rec.update(state=state, exit_code=code, reason=reason, ended=time.time())
    write_state(d, rec)
    return code


if __name__ == "__main__":
    raise SystemExit(supervise(Path(sys.argv[1])))
