"""A job's end, left in its own directory by the job: ``<job dir>/end.json``.

Why: a client waiting for a job used to ask the controller (``scontrol``) every second for as
long as the job ran; on a shared controller that load is what sites rate-limit. The job knows
its own end first, and its directory is on the filesystem the client shares, so the batch
script (and the local supervisor) write the end there and the client watches that one file
with a cheap ``stat``; the controller is asked only to confirm it (:mod:`~torchhpc.schedulers.waiting`).

The file is one JSON object ``{"state", "exit_code", "time", "restart"}``: ``state`` is the
job's own view (COMPLETED for exit 0, FAILED, CANCELLED when the scheduler ended it), a hint
the controller confirms; ``time`` is the epoch second the batch shell saw the step end;
``restart`` is the scheduler's restart count (a marker of an earlier run of a requeued job is
told apart by it). It is written to a hidden temporary file and renamed over ``end.json``, so
a reader sees the whole object or nothing. A job that is requeued from its own script writes
none: it has not ended.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass
from typing import Optional

from torchhpc.core.shell import quote, split_words, wrap_command
from torchhpc.jobdir.layout import END
from torchhpc.launchers.boot import boot_ref

__all__ = ["EndMark", "end_lines", "end_path", "read_end", "write_end"]


@dataclass(frozen=True)
class EndMark:
    """What the job wrote at its end, and which version of the file that was (``key``)."""

    state: str
    exit_code: Optional[int]
    time: float
    restart: int = 0
    # (inode, mtime in ns, size): a new marker (a requeued job's next run) has another key
    key: tuple[int, int, int] = (0, 0, 0)


def end_path(job_dir: str) -> str:
    return os.path.join(job_dir, END)


def read_end(job_dir: str) -> Optional[EndMark]:
    """The job's end marker, or None: not written (yet), or not a marker (never raises)."""
    path = end_path(job_dir)
    try:
        st = os.stat(path)
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("state"), str):
        return None
    code = data.get("exit_code")
    try:
        when = float(data.get("time") or 0.0)
        restart = int(data.get("restart") or 0)
    except (TypeError, ValueError):
        return None
    return EndMark(
        state=data["state"], exit_code=code if isinstance(code, int) else None, time=when, restart=restart,
        key=(st.st_ino, st.st_mtime_ns, st.st_size),
    )


def write_end(job_dir: str, state: str, exit_code: Optional[int], when: Optional[float] = None, restart: int = 0) -> bool:
    """Write the marker atomically (a hidden temporary file renamed over it); False when the
    directory cannot take it (the end is then learnt from the scheduler, as before)."""
    data = {"state": state, "exit_code": exit_code, "time": time.time() if when is None else when, "restart": restart}
    tmp = os.path.join(job_dir, f".{END}.{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(json.dumps(data) + "\n")
        os.replace(tmp, end_path(job_dir))
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        return False
    return True


def end_lines(dir_words: str, restart_ref: str = "0", cancel_trap: bool = True,
              own_code_files: str = "") -> list[str]:
    """The batch script's end marker (said in the boot lines' comment): it sources the boot directory's ``end.sh``
    before ``main``, which removes an earlier run's marker and arms the EXIT trap that writes this one
    (src/torchhpc/boot/end.sh says how).

    ``dir_words``: shell words for the job's directory (the id expands at run time); the marker is written only
    where that directory exists (a script submitted by hand has none). ``cancel_trap``: trap SIGTERM (the
    scheduler ending the job) so that the EXIT trap runs and says CANCELLED; off where the stop protocol traps
    SIGTERM itself, and then the protocol's files beside the job directories end with it (docs/logs.md: one
    directory per job, nothing left in ``--output-dir``). ``own_code_files``: shell words naming the batch output
    (the first that exists is read; a bare name is in the job's directory) where the launcher reported its ranks'
    ends. Its status hides the failed rank's own code: srun exits with its tasks' highest status, so once
    ``--kill-on-bad-exit`` has stopped the others with SIGTERM a rank's ``exit 1`` becomes the job's 143, which
    reads as a cancel; torchrun exits 1 whatever its worker's code. With these files, a failed job ends (marker
    and batch exit status, hence sacct's ExitCode) with the code of the rank that failed first, in the
    launcher's own words (src/torchhpc/boot/first_end.sh).
    """
    head = " ".join([boot_ref("end.sh"), *([] if cancel_trap else ["--stop-protocol"]), dir_words, f'"{restart_ref}"'])
    line = f". {head} {own_code_files}".rstrip()  # the launcher's report on a line of its own
    return [x[2:] for x in wrap_command(line, [len(split_words(head)) + 1] if own_code_files else [], width=160)]


def quoted_dir(prefix: str, id_ref: str) -> str:
    """``<prefix>"<id ref>"``: the job directory's words, its fixed part quoted by core/shell."""
    return f'{quote(prefix)}"{id_ref}"'
