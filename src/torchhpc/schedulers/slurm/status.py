"""Asking Slurm about jobs: status (scontrol, then sacct), cancel, logs, the queue.

The status/parse half of the Slurm backend (slurm/slurm.py renders and submits);
a mixin over :class:`~torchhpc.schedulers.api.Scheduler`'s ``runner`` and ``name``.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, ClassVar, Optional

import torchhpc.schedulers.slurm.nodes as slurm_nodes
from torchhpc.core.proc import Runner
from torchhpc.core.spec import JobSpec
from torchhpc.errors import CommandError, QuotingError, SchedulerError, UnknownJob
from torchhpc.jobdir.record import load_record, update_record
from torchhpc.schedulers.api import JobStatus
from torchhpc.schedulers.slurm.array import summarise, tasks_from_sacct, tasks_from_scontrol
from torchhpc.schedulers.slurm.ending import STOPPED_WHY, one_ending
from torchhpc.schedulers.slurm.many import SACCT_FIELDS, SQUEUE_FIELDS, parse_sacct_rows, parse_squeue
from torchhpc.schedulers.slurm.parse import parse_scontrol, transient
from torchhpc.schedulers.slurm.parse import status_from_scontrol as _status_from_scontrol
from torchhpc.schedulers.waiting import settled

if TYPE_CHECKING:  # status's value types, made by the readers (slurm/times.py, slurm/pending.py): a submit needs neither
    from torchhpc.schedulers.pending import Pending
    from torchhpc.schedulers.times import JobTimes

__all__ = ["SlurmQueries", "expand_output", "first_end_files", "output_pattern"]

# a job, an array task or a heterogeneous component, as Slurm prints them: 123, 123_4, 123+1
_SLURM_ID = r"\d+(?:_\d+|\+\d+)?"  # re compiles (and caches) it on use


class SlurmQueries:
    """status, cancel, log_paths, rank_lines, list_jobs and the node questions for :class:`SlurmScheduler`."""

    name: ClassVar[str]
    runner: Runner

    def status(self, job_id: str, retries: int = 5) -> JobStatus:
        """scontrol while the controller knows the job, sacct after (it forgets after MinJobAge).

        A controller that is briefly unreachable (restart, failover) is retried
        rather than reported: a wait of hours must not die on one dropped poll.
        """
        if not re.fullmatch(_SLURM_ID, job_id):  # sacct's own refusal would name its whole command line
            raise UnknownJob(f"slurm job {job_id} is unknown to Slurm: a Slurm job id is a number, 123, "
                             "or 123_4 for an array task", "check the job id")
        for attempt in range(retries + 1):
            try:
                done = self.runner.run(["scontrol", "show", "job", "-o", job_id], timeout=30)
                if "_" not in job_id and f"ArrayJobId={job_id} " in done.stdout:
                    return summarise(job_id, tasks_from_scontrol(job_id, done.stdout, parse_scontrol, _status_from_scontrol))
                fields = parse_scontrol(done.stdout)
                if fields.get("JobState") == "COMPLETING":  # its NodeList: only the nodes still completing
                    fields["NodeList"] = self._all_nodes(job_id) or fields.get("NodeList", "")
                if fields.get("JobState"):
                    return self._with_dir(_status_from_scontrol(job_id, fields))
                break
            except CommandError as e:
                text = e.stderr + e.stdout
                if "Invalid job id" in text:
                    break
                if attempt == retries or not transient(text):
                    raise
                time.sleep(min(2.0 * (attempt + 1), 10.0))
        return self._with_dir(self._status_from_sacct(job_id))

    def _with_dir(self, st: JobStatus) -> JobStatus:
        # jobdir.logs (the rank logs' reader) in the methods that read: submitting a job never loads it
        from torchhpc.jobdir.logs import task_record

        rec = task_record(self.name, st.job_id)
        st.log_dir = rec.job_dir
        end_dir = st.log_dir if st.log_dir and os.path.isdir(st.log_dir) else None
        st = settled(st, end_dir)
        state, code = one_ending(st.state, st.exit_code, end_dir, st.restarts)  # one code per ending (slurm/ending.py)
        reason = STOPPED_WHY.get(state, st.reason) if state != st.state else st.reason  # not FAILED's NonZeroExitCode
        if rec.cancelled and state.startswith("CANCELLED"):  # not the reason it last waited for (PartitionNodeLimit)
            reason = f"cancelled by torchhpc (user {rec.cancelled})"
        changed = (state, code, reason) != (st.state, st.exit_code, st.reason)
        return replace(st, state=state, exit_code=code, reason=reason) if changed else st

    def _all_nodes(self, job_id: str) -> str:
        """Every node the job had (sacct's NodeList), for a COMPLETING job whose scontrol record names only the
        nodes still cleaning up: after a node loss, the dead node alone (issue 70). "" when sacct cannot say."""
        try:
            out = self.runner.run(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "NodeList"], timeout=30).stdout
        except CommandError:
            return ""
        rows = [r.strip() for r in out.splitlines() if r.strip() and r.strip() not in ("None assigned", "(null)")]
        return rows[0] if rows else ""

    def _status_from_sacct(self, job_id: str) -> JobStatus:
        try:
            done = self.runner.run(
                ["sacct", "-j", job_id, "-X", "-n", "-P", "-o", SACCT_FIELDS],
                timeout=30,
            )
        except CommandError as e:
            said = (e.stderr.strip().splitlines() or [f"exit {e.returncode}"])[-1]  # sacct's words, not its command line
            raise UnknownJob(
                f"slurm job {job_id} is not known to scontrol and sacct failed ({said})",
                "the job id may be wrong, or it ended more than MinJobAge ago on a cluster without accounting",
            ) from None
        tasks = [] if "_" in job_id else tasks_from_sacct(job_id, done.stdout)
        if tasks:
            return summarise(job_id, tasks)
        st = parse_sacct_rows(done.stdout).get(job_id)
        if st is not None:
            return st
        raise UnknownJob(f"slurm job {job_id} is unknown to scontrol and sacct", "check the job id")

    def times(self, job_id: str) -> JobTimes:
        """One ``sacct`` (the accounting daemon, no controller load); its scontrol record where
        accounting has no row (schedulers/slurm/times.py)."""
        from torchhpc.schedulers.slurm.times import sacct_times_argv, times_from_sacct, times_from_scontrol

        try:
            found = times_from_sacct(self.runner.run(sacct_times_argv(job_id), timeout=30).stdout, job_id)
        except CommandError:
            found = None
        if found is not None:
            return self._ended(found, job_id)
        try:  # one scontrol, as status asks first; never a second accounting call
            raw = parse_scontrol(self.runner.run(["scontrol", "show", "job", "-o", job_id], timeout=30).stdout)
        except CommandError as e:
            raise SchedulerError(f"slurm job {job_id}: sacct has no row for it and scontrol does not know it ({e.message})",
                                 "check the job id; a job older than MinJobAge is only in accounting") from None
        return self._ended(times_from_scontrol(raw), job_id)

    def _ended(self, found: JobTimes, job_id: str) -> JobTimes:
        """``found`` with the state and code every reader gives this ending (slurm/ending.py)."""
        from torchhpc.jobdir.logs import task_record

        state, code = one_ending(found.state, found.exit_code, task_record(self.name, job_id).job_dir or None)
        return found if (state, code) == (found.state, found.exit_code) else replace(found, state=state, exit_code=code)

    def cancel(self, job_id: str) -> None:
        self.runner.run(["scancel", job_id])
        if load_record(self.name, job_id) is not None:  # who and when: the controller does not say (status, diagnose)
            import getpass

            update_record(self.name, job_id, cancelled=f"{getpass.getuser()} at {time.strftime('%H:%M:%S')}")

    def query_many(self, ids: Sequence[str]) -> dict[str, JobStatus]:
        """Every id's state from one squeue (and one sacct for the forgotten): schedulers/slurm_many.py."""
        from torchhpc.schedulers.slurm.many import query_many

        return {job_id: self._with_dir(st) for job_id, st in query_many(self.runner, ids).items()}
    # the questions of Scheduler's contract that only Slurm answers
    accepts_nodelist: ClassVar[bool] = True

    def preflight(self, spec: JobSpec) -> None:
        """What could never run is refused before sbatch (slurm/nodes.py, slurm/fits.py): exit 2 with a HINT."""
        from torchhpc.schedulers.slurm import fits

        fits.check_command(spec)
        slurm_nodes.check_gpus(spec, self.runner)
        fits.check_fits(spec, self.runner)
        fits.check_account(spec, self.runner)
        fits.check_dependencies(spec, self.runner)

    def task_id(self, job_id: str, task: int) -> str | None:
        return f"{job_id}_{task}"  # Slurm knows each array task by itself

    def controller(self) -> tuple[bool, str]:
        try:
            done = self.runner.run(["scontrol", "ping"], check=False, timeout=15)
        except CommandError as e:
            return False, f"scontrol ping: {e.message}"
        out = (done.stdout + done.stderr).strip().replace("\n", "; ")
        return done.returncode == 0 and "UP" in out, f"scontrol ping: {out or 'exit ' + str(done.returncode)}"

    def node_names(self) -> list[str]:
        return slurm_nodes.node_names(self.runner)

    def log_paths(self, job_id: str) -> list[str]:
        from torchhpc.jobdir.logs import task_record

        rec = task_record(self.name, job_id)  # an array task: its array's record
        if rec.output_path:
            return [rec.output_path]
        pattern, name = rec.output, rec.name
        if not pattern:
            try:
                fields = parse_scontrol(self.runner.run(["scontrol", "show", "job", "-o", job_id]).stdout)
                return [fields["StdOut"]] if fields.get("StdOut") else []
            except CommandError:
                return []
        return [expand_output(pattern, name, job_id)]

    def rank_lines(self, job_id: str, text: str, rank: int) -> str:
        from torchhpc.jobdir.logs import filter_rank, task_record

        rec = task_record(self.name, job_id)
        return filter_rank(text, rank, rec.launcher or "srun", rec.nproc_per_node)

    def explain_pending(self, st: JobStatus) -> Optional[Pending]:
        """One round of sinfo/squeue (and sacctmgr where a limit holds it) explains a pending job
        (schedulers/slurm/pending.py); ``st`` carries the job's scontrol fields already."""
        if st.state != "PENDING" or not st.raw or st.tasks:
            return None
        from torchhpc.schedulers.slurm.pending import explain

        return explain(self.runner, st.raw)

    def list_jobs(self) -> list[JobStatus]:
        """This user's queue in status's own fields (many.py's squeue columns): the nodes by name, the reason
        alone (``%R`` is the node list for a running job), elapsed as scontrol writes it, the job's directory."""
        done = self.runner.run(["squeue", "--me", "-h", "-O", SQUEUE_FIELDS])
        return [self._with_dir(st) for st in parse_squeue(done.stdout).values()]


def expand_output(pattern: str, name: str, job_id: str) -> str:
    """The log file an :func:`output_pattern` names for one job or array task ``ARRAY_TASK``
    (``%%``, ``%x``, ``%j``, ``%A``, ``%a``)."""
    array_id, _, task = job_id.partition("_")
    values = {"%": "%", "x": name, "j": job_id, "A": array_id, "a": task}
    return re.sub(r"%([%xjAa])", lambda m: values[m.group(1)], pattern)


def output_pattern(spec: JobSpec) -> str:
    """sbatch's ``--output``: ``DIR/%x-%j.out``, where only our ``%x`` and ``%j`` are patterns.

    A ``%`` in the directory is written ``%%`` (sbatch would expand ``%j`` there too); a
    job name that ``%x`` would turn into a path or a pattern (``/``, ``../``, ``%``) is
    written literally, made file-name safe. sbatch expands nothing in a name that holds
    a backslash, so such a directory is refused.
    """
    out = os.path.abspath(spec.output_dir)
    if "\\" in out:
        raise QuotingError(
            f"--output-dir {out!r} contains a backslash: sbatch would not expand %j in the log name",
            "choose a directory without a backslash",
        )
    out = out.replace("%", "%%")
    job = "%A_%a" if spec.array is not None else "%j"  # an array: one file per task, ARRAYJOB_TASK
    if "/" in spec.name or "%" in spec.name:
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", spec.name).lstrip(".") or "job"
        return os.path.join(out, f"{safe}-{job}.out")
    return os.path.join(out, f"%x-{job}.out")


def first_end_files(spec: JobSpec) -> str:
    """Where the launcher's report of each rank's end is (shell words, for the end trap's first_end.sh):
    the job directory's slurm.out (``torchhpc run``), else the script's own ``--output`` (``sbatch FILE``;
    an array task's file). "" for mpirun (it exits with the first failed process's own code) and where a
    supervisor runs (its status is the failure's class, not the launcher's)."""
    from torchhpc.core.shell import quote
    from torchhpc.jobdir.endmark import quoted_dir
    from torchhpc.launchers import launcher_of

    launcher = launcher_of(spec)
    if spec.supervised or not (launcher.own_step or launcher.per_node):  # srun's tasks, torchrun's workers
        return ""
    array = spec.array is not None
    ref = "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}" if array else "$SLURM_JOB_ID"
    at = "\x00"  # where the id goes: the path around it is quoted, the id expands at run time
    path = expand_output(output_pattern(spec), spec.name, f"{at}_{at}" if array else at)
    before, _, after = path.replace(f"{at}_{at}", at).partition(at)
    own = quoted_dir(before, ref) + (quote(after) if after else "")
    return own if array else f"slurm.out {own}"
