"""Many Slurm jobs in one question: ``squeue`` for all of them, ``sacct`` for those it no longer shows.

``status`` of one job asks ``scontrol`` (one job-info RPC). A caller that shows many jobs at once
(``torchhpc status A B C``, a pipeline's steps, a sweep's tasks) asks here instead: one ``squeue``
for every id (array ids expand to their tasks with ``-r``; ``--states=all`` keeps the jobs that
ended within the controller's MinJobAge), then, only for the ids the controller has forgotten, one
``sacct`` (which asks the accounting daemon, not the controller). At 1000 jobs the parsing takes a
few milliseconds (benchmarks/controller_load.py measures it on recorded output).
"""

from __future__ import annotations

from collections.abc import Sequence

from torchhpc.core.proc import Runner
from torchhpc.errors import CommandError
from torchhpc.schedulers.api import JobStatus
from torchhpc.schedulers.slurm.array import summarise, tasks_from_sacct
from torchhpc.schedulers.slurm.parse import elapsed_hms, exit_code_of

__all__ = ["SACCT_FIELDS", "SQUEUE_FIELDS", "parse_sacct_rows", "parse_squeue", "query_many"]

# squeue -O: the name last (it may hold the separator); exit_code is the raw wait status.
SQUEUE_FIELDS = "JobArrayID:|,State:|,exit_code:|,TimeUsed:|,NodeList:|,Reason:|,Name:|"
SACCT_FIELDS = "JobID,State,ExitCode,Elapsed,NodeList,JobName"


def _exit(raw: str) -> int | None:
    """squeue's exit_code is a wait status: 768 is exit 3; a signal is 128 + it, as scontrol's N:S reads."""
    if not raw.isdigit():
        return None
    status = int(raw)
    return 128 + (status & 0x7F) if status & 0x7F else status >> 8


def parse_squeue(text: str) -> dict[str, JobStatus]:
    """``squeue -h -r -O SQUEUE_FIELDS`` rows by job id (``123``, array tasks ``123_4``)."""
    out: dict[str, JobStatus] = {}
    for line in text.splitlines():
        parts = line.split("|", 6)
        if len(parts) < 7 or not parts[0]:
            continue
        job_id, state, code, used, nodes, reason, name = parts
        name = name.removesuffix("|")
        out[job_id] = JobStatus(job_id, state.split()[0] if state else "UNKNOWN",
                                _exit(code),  # JobStatus drops it while the job has not ended, as scontrol's
                                "" if reason in ("None", "(null)") else reason, elapsed_hms(used), name, nodes)
    return out


def parse_sacct_rows(text: str) -> dict[str, JobStatus]:
    """``sacct -X -n -P -o SACCT_FIELDS`` rows by job id (pending array ranges are left to tasks_from_sacct)."""
    out: dict[str, JobStatus] = {}
    for line in text.splitlines():
        parts = line.split("|", 5)
        if len(parts) != 6 or "[" in parts[0]:
            continue
        state = parts[1].split()[0] if parts[1] else "UNKNOWN"
        out[parts[0]] = JobStatus(parts[0], state, exit_code_of(parts[2]), "", parts[3], parts[5], parts[4])
    return out


def _pick(job_id: str, rows: dict[str, JobStatus], tasks_of: dict[str, list[JobStatus]]) -> JobStatus | None:
    """The job itself, or an array (an id without ``_`` whose rows are its tasks) summarised."""
    if job_id in rows and job_id not in tasks_of:
        return rows[job_id]
    tasks = tasks_of.get(job_id)
    return summarise(job_id, tasks) if tasks else None


def _by_array(rows: dict[str, JobStatus]) -> dict[str, list[JobStatus]]:
    out: dict[str, list[JobStatus]] = {}
    for job_id, st in rows.items():
        base, sep, task = job_id.partition("_")
        if sep and task.isdigit():
            out.setdefault(base, []).append(st)
    for tasks in out.values():
        tasks.sort(key=lambda t: int(t.job_id.rsplit("_", 1)[1]))
    return out


def query_many(runner: Runner, ids: Sequence[str]) -> dict[str, JobStatus]:
    """Every id's status (ids the scheduler knows nothing of are left out): one squeue, at most one sacct."""
    wanted = list(dict.fromkeys(ids))
    if not wanted:
        return {}
    found: dict[str, JobStatus] = {}
    try:
        done = runner.run(["squeue", "-h", "-r", "--states=all", "-j", ",".join(wanted), "-O", SQUEUE_FIELDS], timeout=60)
        rows = parse_squeue(done.stdout)
    except CommandError as e:
        if "Invalid job id" not in e.stderr + e.stdout:
            raise
        rows = {}  # none of them is known to the controller any more
    arrays = _by_array(rows)
    for job_id in wanted:
        st = _pick(job_id, rows, arrays)
        if st is not None:
            found[job_id] = st
    rest = [j for j in wanted if j not in found]
    if rest:
        try:
            done = runner.run(["sacct", "-X", "-n", "-P", "-j", ",".join(rest), "-o", SACCT_FIELDS], timeout=60)
        except CommandError:
            return found  # no accounting here: what the controller knew is all there is
        acct = parse_sacct_rows(done.stdout)
        for job_id in rest:
            tasks = [] if "_" in job_id else tasks_from_sacct(job_id, done.stdout)
            st = summarise(job_id, tasks) if tasks else acct.get(job_id)
            if st is not None:
                found[job_id] = st
    return found
