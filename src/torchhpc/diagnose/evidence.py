"""What a job left behind for its verdict (diagnose/verdict.py): each rank's lines and log, the launcher's, the
scheduler's final state, the hang watch's and the Flight Recorder's findings, the supervisor's attempts. Gathered
once from the scheduler and the job's directory; :func:`torchhpc.diagnose.verdict.diagnose` weighs it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Optional

from torchhpc.core.handle import Handle
from torchhpc.diagnose.flight import Finding, post_mortem
from torchhpc.jobdir.logs import Line, job_log, rank_files

__all__ = ["Evidence", "RankFailure", "gather"]


@dataclass(frozen=True)
class RankFailure:
    """One rank's end, as far as the evidence says."""

    rank: int
    host: str = ""
    klass: str = "unknown"
    exit: str = ""  # "exit 1", "SIGABRT", ... (the rank's own, not the launcher's)
    error: str = ""  # the exception line or the crash message
    where: str = ""  # innermost frame in the user's code: file:line
    log: str = ""
    when: float = 0.0  # sort key: earlier failed first
    consequence: bool = False


@dataclass(frozen=True)
class Evidence:
    """What :func:`diagnose` reads. All optional: it says what it could not see."""

    lines: Sequence[Line] = ()
    failed_at: Mapping[int, float] = field(default_factory=dict)  # rank -> its log file's last write
    rank_logs: Mapping[int, str] = field(default_factory=dict)  # rank -> path of its own log
    nodes: Mapping[int, str] = field(default_factory=dict)  # rank -> host
    launcher: str = ""
    nproc_per_node: int = 1
    state: str = ""  # the scheduler's final state (sacct State)
    exit_code: Optional[int] = None  # the job's exit code
    job: str = ""  # "slurm:123", for the suggested commands
    hang: Optional[Mapping[str, object]] = None  # the hang watch's saved diagnosis (hang.json)
    local: bool = False  # the local scheduler: its supervisor's reason names the rank that ended first
    flight: Sequence[Finding] = ()  # what the ranks' Flight Recorder dumps say (diagnose/flight.py)
    attempts: Sequence[Mapping[str, object]] = ()  # the supervisor's attempts.json (supervisor/attempts.py)
    reason: str = ""  # the scheduler's reason for the state (DependencyNeverSatisfied; the local run's own words)
    job_dir: str = ""  # where hang.json, attempts.json and fr/ are (the readers name the file, not only its data)



def gather(scheduler: object, name: str, job_id: str) -> Evidence:
    """Collect a job's evidence: its record's log files and the scheduler's final state.

    ``scheduler`` is the scheduler object (``status`` and ``log_paths``); a scheduler that cannot
    answer leaves that part empty, and the verdict says what it saw.
    """
    import os

    state, code, reason, hosts = "", None, "", ""
    with suppress(Exception):  # the verdict works from the logs alone
        st = scheduler.status(job_id)  # type: ignore[attr-defined]
        state, code, reason, hosts = st.state, st.exit_code, st.reason, st.nodes
    paths: list[str] = []
    with suppress(Exception):
        paths = scheduler.log_paths(job_id)  # type: ignore[attr-defined]
    log = job_log(name, job_id, output=paths[0] if paths else None)
    if log is None:
        return Evidence(state=state, exit_code=code, job=str(Handle(name, job_id)), reason=reason)
    files = rank_files(log.ranks_dir) if log.ranks_dir else {}
    lines = log.read(final=True)
    local = bool(getattr(scheduler, "runs_here", False))
    if local:  # the local supervisor says which rank ended first, in the job's reason
        lines = [*lines, Line(None, reason)] if reason else lines
    nodes = {r: n for r, (_p, n) in files.items()}
    if not nodes and hosts and "," not in hosts and "[" not in hosts:  # one node: every rank is on it
        nodes = {ln.rank: hosts for ln in lines if ln.rank is not None}
    from torchhpc.diagnose.hang import load as load_hang
    from torchhpc.jobdir.attempts import load_attempts

    where = os.path.dirname(log.ranks_dir) if log.ranks_dir else os.path.dirname(log.output or "")
    hang = load_hang(where) if where else None
    return Evidence(
        attempts=load_attempts(where) if where else [],
        job_dir=where,
        hang=hang,
        flight=post_mortem(where) if where and not hang else (),
        lines=lines,
        failed_at=log.failure_order(),
        rank_logs={r: p for r, (p, _n) in files.items()},
        nodes=nodes,
        launcher=log.launcher,
        local=local,
        nproc_per_node=log.nproc_per_node,
        state=state,
        exit_code=code,
        job=str(Handle(name, job_id)),
        reason=reason,
    )
