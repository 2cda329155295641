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

import json
import os
import time
from dataclasses import dataclass
from typing import Optional

from torchhpc.core.shell import quote
from torchhpc.jobdir.layout import END
from torchhpc.launchers.boot import boot_ref

__all__ = ["END_FILE", "EndMark", "end_lines", "end_path", "read_end", "write_end"]

END_FILE = END


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
    return os.path.join(job_dir, END_FILE)


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
    tmp = os.path.join(job_dir, f".{END_FILE}.{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(json.dumps(data) + "\n")
        os.replace(tmp, end_path(job_dir))
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return False
    return True


def end_lines(dir_words: str, restart_ref: str = "0", cancel_trap: bool = True,
              own_code_files: str = "") -> list[str]:
    """The batch script's end marker: a helper, and ``_torchhpc_end_arm`` (called just before
    ``main``) that removes an earlier run's marker and arms the EXIT trap.

    ``dir_words``: shell words for the job's directory (the id expands at run time); the marker
    is written only where that directory exists (a script submitted by hand has none).
    ``cancel_trap``: trap SIGTERM (the scheduler ending the job) so that the EXIT trap runs and
    says CANCELLED; off where the stop protocol traps SIGTERM itself. A requeue from the script
    sets ``_torchhpc_end_state=REQUEUED``: no marker, the job goes on. SIGKILL leaves none: the
    client learns that end from the scheduler, at its next (backed-off) question.
    At the job's end (not a requeue from its script) the stop protocol's files beside the job directories go
    with it, where the script has the protocol (``cancel_trap`` off: it traps SIGTERM itself): ``$TORCHHPC_STOP_FILE``,
    its ``.taken`` and the time-limit count (docs/logs.md: one directory per job, nothing left in ``--output-dir``).
    ``own_code_files``: shell words naming the batch output (the first that exists is read) where the
    launcher reported its ranks' ends. Its status hides the failed rank's own code: srun exits with its
    tasks' highest status, so once ``--kill-on-bad-exit`` has stopped the others with SIGTERM a rank's
    ``exit 1`` becomes the job's 143, which reads as a cancel; torchrun exits 1 whatever its worker's
    code. With these files, a failed job ends (marker and batch exit status, hence sacct's ExitCode)
    with the code of the rank that failed first, in the launcher's own words: torchrun's root cause
    ``exitcode  : 3`` is 3, srun's ``task 2: Exited with exit code 1`` is 1, ``Aborted`` 134. A first
    end of SIGTERM, or none, keeps the status (src/torchhpc/boot/first_end.sh).
    """
    arm = [
        "_torchhpc_end_arm() {",
        f'  rm -f -- {dir_words}/{END_FILE}',
        "  trap '_torchhpc_end $?' EXIT",
    ]
    if cancel_trap:
        arm.append("  trap '_torchhpc_end_state=CANCELLED; exit 143' TERM")
    arm.append("}")
    if_failed = '  if [ "$_s" = COMPLETED ] && [ "$_rc" -ne 0 ]; then'
    failed = [f"{if_failed} _s=FAILED; fi"]
    if own_code_files:  # a failed job also asks which rank failed first
        failed = [
            if_failed,
            "    _s=FAILED  # the launcher's status hides the rank's own code:",
            f'    _own=$(bash {boot_ref("first_end.sh")} "$_rc" \\',
            f"      {own_code_files} 2>/dev/null)",
            "  fi",
        ]
    return [
        "# The job's end into <job dir>/end.json from the EXIT trap (also after a failure or a cancel): clients",
        "# wait on that file instead of asking the controller every second (docs/script.md).",
        '_torchhpc_end_state=""',
        "_torchhpc_end() {",
        "  local _rc=$1 _d _s=${_torchhpc_end_state:-COMPLETED} _t=${EPOCHREALTIME:-$(date +%s)} _own=",
        "  set +eu",
        f"  _d={dir_words}",
        '  if [ "$_s" = REQUEUED ]; then return 0; fi',
        *([] if cancel_trap else [  # the stop protocol's: its files (the request, a rank's word, the count) end here
            "  # the stop protocol's files (stop request, a rank's word it took it, the time-limit count) end with the job",
            '  rm -f -- ${TORCHHPC_STOP_FILE:+"$TORCHHPC_STOP_FILE" "$TORCHHPC_STOP_FILE.taken"}'
            ' ${_torchhpc_timeouts_file:+"$_torchhpc_timeouts_file"} 2>/dev/null',
        ]),
        '  case ${_torchhpc_stop_reason:-} in ended-by-slurm|terminated) _s=CANCELLED ;; esac',
        *failed,
        '  if [ -d "$_d" ]; then',
        "    printf '{\"state\": \"%s\", \"exit_code\": %d, \"time\": %s, \"restart\": %d}\\n' \\",
        f'      "$_s" "${{_own:-$_rc}}" "${{_t/,/.}}" "{restart_ref}" >"$_d/.{END_FILE}.$$" 2>/dev/null \\',
        f'      && mv -f -- "$_d/.{END_FILE}.$$" "$_d/{END_FILE}" 2>/dev/null',
        "  fi",
        '  if [ -n "$_own" ] && [ "$_own" != "$_rc" ]; then exit "$_own"; fi  # the shell\'s status too',
        "  return 0",
        "}",
        *arm,
    ]


def quoted_dir(prefix: str, id_ref: str) -> str:
    """``<prefix>"<id ref>"``: the job directory's words, its fixed part quoted by core/shell."""
    return f'{quote(prefix)}"{id_ref}"'
