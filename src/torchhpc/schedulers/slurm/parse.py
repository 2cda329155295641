"""Reading Slurm's answers: ``scontrol show job -o`` fields and job states."""

from __future__ import annotations

import re

from torchhpc.schedulers.api import JobStatus

__all__ = ["parse_scontrol", "status_from_scontrol", "transient"]


def transient(text: str) -> bool:
    return any(m in text for m in ("Unable to contact slurm controller", "Socket timed out", "Zero Bytes were transmitted"))


def parse_scontrol(text: str) -> dict[str, str]:
    """``scontrol show job -o`` -> fields. The last occurrence of a key wins, so a
    job name containing ``JobState=...`` (it comes first) cannot spoof the state."""
    fields: dict[str, str] = {}
    for m in re.finditer(r"(?:^|\s)([A-Za-z][A-Za-z_:/]*)=(\S*)", text.strip()):
        fields[m.group(1)] = m.group(2)
    return fields


def status_from_scontrol(job_id: str, f: dict[str, str]) -> JobStatus:
    code = f.get("ExitCode", "")
    rc: int | None = None
    if ":" in code:
        status, signal = code.split(":", 1)
        rc = int(status) if status.isdigit() else None
        if rc == 0 and signal.isdigit() and int(signal):
            rc = 128 + int(signal)
    restarts = f.get("Restarts", "0")
    return JobStatus(
        job_id=job_id,
        state=f.get("JobState", "UNKNOWN"),
        exit_code=rc,
        reason=f.get("Reason", ""),
        elapsed=f.get("RunTime", ""),
        name=f.get("JobName", ""),
        nodes=f.get("NodeList", ""),
        restarts=int(restarts) if restarts.isdigit() else 0,
        raw=f,
    )

