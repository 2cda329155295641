"""Asking PBS about jobs: status (``qstat -x -f -F json``, else Torque's plain ``qstat -f``), cancel, logs, the
queue. The query half of the PBS backend (pbs/pbs.py renders and submits), as slurm/status.py is Slurm's; a mixin
over :class:`~torchhpc.schedulers.api.Scheduler`'s ``runner`` and ``name``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import ClassVar, Optional

from torchhpc.core.proc import Runner
from torchhpc.errors import CommandError, CommandNotFound, SchedulerError, UnknownJob
from torchhpc.jobdir.logs import filter_rank
from torchhpc.jobdir.record import read_record
from torchhpc.launchers import get_launcher
from torchhpc.schedulers.api import JobStatus
from torchhpc.schedulers.pbs.parse import find_job, parse_qstat_full, parse_qstat_json, status_from_attrs
from torchhpc.schedulers.pending import Pending
from torchhpc.schedulers.times import JobTimes
from torchhpc.schedulers.waiting import settled

__all__ = ["PBSQueries"]


class PBSQueries:
    """status, times, the many-jobs question, cancel, log_paths, rank_lines and list_jobs for :class:`PBSScheduler`."""

    name: ClassVar[str]
    runner: Runner
    query_hint: ClassVar[Optional[str]]

    end_dir: Callable[[str], Optional[str]]  # the batch scheduler's (schedulers/batch/base.py)

    def _qstat(self, job_id: str) -> dict[str, dict[str, str]]:
        """``qstat -x -f -F json`` (PBS Pro, finished jobs included); plain ``qstat -f`` elsewhere."""
        try:
            done = self.runner.run(["qstat", "-x", "-f", "-F", "json", job_id], timeout=30, hint=self.query_hint)
            return parse_qstat_json(done.stdout)
        except CommandNotFound:
            raise  # no qstat at all: the fallback below would not find it either
        except CommandError as e:
            if _unknown_job(e):
                raise self._unknown(job_id) from None
            # Torque and old PBS have neither -x nor -F json: fall back to the plain listing.
        try:
            done = self.runner.run(["qstat", "-f", job_id], timeout=30, hint=self.query_hint)
        except CommandError as e:
            if _unknown_job(e):
                raise self._unknown(job_id) from None
            raise
        return parse_qstat_full(done.stdout)

    def _unknown(self, job_id: str) -> SchedulerError:
        return UnknownJob(
            f"pbs job {job_id} is unknown to qstat",
            "finished jobs are kept only while the server's job_history_enable/keep_completed allows; "
            "check the job id and the output file",
        )

    def explain_pending(self, st: JobStatus) -> Optional[Pending]:
        """Why a queued job waits, from the qstat -f attributes ``status`` read (schedulers/pbs/pending.py)."""
        if st.state != "PENDING" or not st.raw:
            return None
        from torchhpc.schedulers.pbs.pending import classify

        return classify(st.job_id, st.raw)

    def status(self, job_id: str) -> JobStatus:
        found = find_job(self._qstat(job_id), job_id)
        if found is None:
            raise self._unknown(job_id)
        return settled(status_from_attrs(*found), self.end_dir(job_id))

    def times(self, job_id: str) -> JobTimes:  # the attributes status reads: qtime, etime, stime, ...
        from torchhpc.schedulers.pbs.times import times_from_attrs
        return times_from_attrs(job_id, self.status(job_id).raw)

    def query_many(self, ids: Sequence[str]) -> dict[str, JobStatus]:
        """One ``qstat -x -f -F json ID...`` for all (an unknown id is left out: qstat says so on
        stderr and answers for the others); Torque's qstat without JSON: one question each."""
        wanted = list(dict.fromkeys(ids))
        if not wanted:
            return {}
        done = self.runner.run(["qstat", "-x", "-f", "-F", "json", *wanted], check=False, timeout=60, hint=self.query_hint)
        try:
            jobs = parse_qstat_json(done.stdout)
        except (SchedulerError, ValueError):
            return super().query_many(wanted)  # type: ignore[misc]  # the one-at-a-time default (api.Scheduler)
        return {job_id: status_from_attrs(*found)
                for job_id in wanted if (found := find_job(jobs, job_id)) is not None}

    def cancel(self, job_id: str) -> None:
        # -W force would skip the epilogue; plain qdel lets PBS clean up the nodes.
        self.runner.run(["qdel", job_id])

    def log_paths(self, job_id: str) -> list[str]:
        rec = read_record(self.name, job_id)
        seq = job_id.split(".")[0]
        if rec.output_dir:
            return [os.path.join(rec.output_dir, f"{rec.name}.o{seq}")]
        try:
            found = find_job(self._qstat(job_id), job_id)
        except (CommandError, SchedulerError):
            return []
        if found is None:
            return []
        path = found[1].get("Output_Path", "")
        path = path.split(":", 1)[1] if ":" in path else path  # host:/path
        if path.endswith("/"):
            path += f"{found[1].get('Job_Name', '')}.o{seq}"
        return [path] if path else []

    def rank_lines(self, job_id: str, text: str, rank: int) -> str:
        launcher = get_launcher(read_record(self.name, job_id).launcher or "mpirun")
        if launcher.per_node:
            # c10d numbers the nodes itself, so no line says which node a torchrun rank is on.
            raise SchedulerError(
                f"cannot pick rank {rank} out of a torchrun job's PBS log",
                "per-rank logs need --launcher mpirun (lines tagged [job,rank]); drop --rank to see all",
            )
        return filter_rank(text, rank, launcher.name, 1)

    def list_jobs(self) -> list[JobStatus]:
        """This user's jobs (``Job_Owner`` is ``user@host``); qstat's ``-u`` does not combine with ``-f``."""
        hint = self.query_hint
        try:
            jobs = parse_qstat_json(self.runner.run(["qstat", "-f", "-F", "json"], timeout=30, hint=hint).stdout)
        except CommandNotFound:
            raise  # no qstat at all: the fallback below would not find it either
        except CommandError:
            # Torque and old PBS have no -F json.
            jobs = parse_qstat_full(self.runner.run(["qstat", "-f"], timeout=30, hint=hint).stdout)
        user = os.environ.get("USER", "")
        return [
            status_from_attrs(jid, attrs)
            for jid, attrs in jobs.items()
            if not user or attrs.get("Job_Owner", "").split("@")[0] in ("", user)
        ]


def _unknown_job(e: CommandError) -> bool:
    text = f"{e.stderr}\n{e.stdout}"
    return "Unknown Job Id" in text or "Job has finished" in text
