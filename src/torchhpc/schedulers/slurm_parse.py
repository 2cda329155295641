"""Reading Slurm's answers: ``scontrol show job -o`` fields, job states, one rank's log lines."""

from __future__ import annotations

import re

from torchhpc.schedulers.api import JobStatus

__all__ = ["filter_rank", "parse_scontrol", "status_from_scontrol", "transient"]


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


def filter_rank(text: str, rank: int, launcher: str, nproc_per_node: int) -> str:
    """Keep one rank's lines from a job log.

    srun ``--label`` prefixes ``TASK: ``; under torchrun the task is the node and
    torchrun's ``--tee`` adds ``[defaultLOCAL]:``; mpirun ``--tag-output`` adds
    ``[JOB,RANK]<stdout>:``.
    """
    keep: list[str] = []
    if launcher == "torchrun":
        node, local = divmod(rank, max(1, nproc_per_node))
        pat = re.compile(rf"^\s*{node}: \[default{local}\]:")
    elif launcher == "mpirun":
        pat = re.compile(rf"^\[\d+,{rank}\]<std(?:out|err)>:")
    else:
        pat = re.compile(rf"^\s*{rank}: ")
    for line in text.splitlines(keepends=True):
        if pat.match(line):
            keep.append(line)
    return "".join(keep)
