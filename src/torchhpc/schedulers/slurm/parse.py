"""Reading Slurm's answers: ``scontrol show job -o`` fields and job states."""

from __future__ import annotations

import re

from torchhpc.schedulers.api import JobStatus

__all__ = ["elapsed_hms", "exit_code_of", "parse_scontrol", "status_from_scontrol", "transient"]


def transient(text: str) -> bool:
    return any(m in text for m in ("Unable to contact slurm controller", "Socket timed out", "Zero Bytes were transmitted"))


def parse_scontrol(text: str) -> dict[str, str]:
    """``scontrol show job -o`` -> fields. The last occurrence of a key wins, so a
    job name containing ``JobState=...`` (it comes first) cannot spoof the state."""
    return {m.group(1): m.group(2) for m in re.finditer(r"(?:^|\s)([A-Za-z][A-Za-z_:/]*)=(\S*)", text.strip())}


def exit_code_of(field: str) -> int | None:
    """Slurm's ``ExitCode`` ``N:S`` as one exit code: N, or 128 + S for a job a signal S ended.

    scontrol and squeue give the batch shell's status as it was; sacct prints one over 128 less 128
    (143 as ``15:0``, 134 as ``6:0``) or drops it (``0:0``), which the job's end marker puts back
    (schedulers/slurm/ending.py). Every reader of the field goes through here."""
    status, _, signal = field.partition(":")
    if signal.isdigit() and int(signal) and status in ("", "0"):
        return 128 + int(signal)
    return int(status) if status.isdigit() else None


def elapsed_hms(text: str) -> str:
    """squeue's TimeUsed (``0:10``, ``1:02:03``, ``1-02:03:04``) as scontrol and sacct write it (``00:00:10``): one
    form for one job, whichever command answered (``status A`` and ``status A B`` printed both)."""
    days, sep, clock = text.rpartition("-")
    parts = clock.split(":")
    if not all(p.isdigit() for p in parts) or not 1 <= len(parts) <= 3:
        return text
    h, m, sec = ([0] * (3 - len(parts)) + [int(p) for p in parts])
    return f"{days}{sep}{h:02d}:{m:02d}:{sec:02d}"


def _run_time(f: dict[str, str]) -> str:
    """``RunTime``, except for a job that never started: Slurm then gives now minus the epoch
    (``20789-02:11:52`` for a job cancelled by a failed dependency); it ran ``00:00:00``, as sacct says."""
    if f.get("StartTime", "") in ("Unknown", "None", "") and f.get("JobState") not in ("PENDING", "RUNNING"):
        return "00:00:00"
    return f.get("RunTime", "")


def status_from_scontrol(job_id: str, f: dict[str, str]) -> JobStatus:
    rc = exit_code_of(f.get("ExitCode", ""))
    restarts = f.get("Restarts", "0")
    return JobStatus(
        job_id=job_id,
        state=f.get("JobState", "UNKNOWN"),
        exit_code=rc,
        reason=f.get("Reason", ""),
        elapsed=_run_time(f),
        name=f.get("JobName", ""),
        nodes=f.get("NodeList", ""),
        restarts=int(restarts) if restarts.isdigit() else 0,
        raw=f,
    )

