"""Local jobs in the background, with a record, so ``status``/``logs``/``cancel``/``wait``/``list`` work.

``torchhpc run`` on the local scheduler runs in the foreground, like torchrun.
A job started in the background (``torchhpc run --background``, or
``Job(...).submit()`` on the local scheduler) gets a job directory under the
state directory (``$TORCHHPC_STATE_DIR``, default ``~/.cache/torchhpc``)::

    jobs/local/<id>/record.json        name, pid, state, exit code, times
    jobs/local/<id>/output.log         every rank's output, prefixed [rankN]:
    jobs/local/<id>/submission.pickle  what to run (read once by the supervisor)

The supervisor is ``python -m torchhpc.supervisor.background DIR`` in its own
session: it runs the ranks exactly as the foreground path does (same env
contract, same fail-fast teardown) and writes the final state into the record
before it exits. ``cancel`` sends it SIGTERM; it stops the ranks and records
CANCELLED. A supervisor that vanished without writing a state (SIGKILL, a
reboot) reads as FAILED with that reason, never as running forever.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, ClassVar

from torchhpc.core.handle import Handle
from torchhpc.errors import SchedulerError, UnknownJob
from torchhpc.jobdir.layout import RECORD
from torchhpc.jobdir.logs import task_text
from torchhpc.jobdir.record import dependency_record, forget_record, new_record, record_dir, save_record
from torchhpc.schedulers.api import JobStatus, Submission
from torchhpc.schedulers.local.allocation import run_id_of
from torchhpc.schedulers.times import JobTimes, clock

__all__ = ["LocalJobs", "job_dir"]

LOG, SUBMISSION = "output.log", "submission.pickle"


def jobs_root() -> Path:
    return record_dir() / "local"


def job_dir(job_id: str) -> Path:
    if not job_id or "/" in job_id or job_id.startswith("."):
        raise UnknownJob(f"{Handle('local', job_id)} is not a local job id", "`torchhpc list` shows the local jobs")
    return jobs_root() / job_id


_UNREADABLE_HINT = "torchhpc writes that file itself: if the job is over, remove {d}"


def read_state(d: Path) -> dict[str, Any]:
    """The job's record: a JSON object. SchedulerError when it is missing, unreadable or anything else."""
    try:
        data = json.loads((d / RECORD).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UnknownJob(
            f"{Handle('local', d.name)} is not a local job here (no record in {d})",
            "`torchhpc list` shows local jobs started with --background or Job.submit()",
        ) from None
    except (OSError, ValueError) as e:  # ValueError: bad JSON, or bytes that are not UTF-8
        raise SchedulerError(f"the record of {Handle('local', d.name)} cannot be read: {e}", _UNREADABLE_HINT.format(d=d)) from None
    if not isinstance(data, dict):
        raise SchedulerError(
            f"the record of {Handle('local', d.name)} cannot be read: {d / RECORD} holds a JSON {type(data).__name__}, not an object",
            _UNREADABLE_HINT.format(d=d),
        )
    return data


def _pid(rec: dict[str, Any], d: Path) -> int:
    """The supervisor's process id in a record (0: none yet)."""
    try:
        return int(rec.get("pid") or 0)
    except (TypeError, ValueError):
        raise SchedulerError(
            f"the record of {Handle('local', d.name)} cannot be read: pid {rec.get('pid')!r} is not a process id",
            _UNREADABLE_HINT.format(d=d),
        ) from None


def _vanished(rec: dict[str, Any], d: Path, pid: int) -> dict[str, Any]:
    """What a record says of a job whose torchhpc process is gone without writing its end.

    Every way out that Python can run (an exception, Ctrl-C, SIGTERM, SIGHUP) records the end, so a
    process that vanished was killed by SIGKILL (or the machine went down): a foreground run then
    ended with the shell's 137. Its end is its last sign of life, the newest write to its directory,
    so ``list`` does not count the time since as the job's.
    """
    last = max((p.stat().st_mtime for p in (d / RECORD, d / LOG) if p.exists()), default=time.time())
    if rec.get("foreground"):
        return {"exit_code": 137, "ended": last,
                "reason": f"the foreground `torchhpc run` (pid {pid}) was killed (SIGKILL) before it could record its end"}
    return {"ended": last, "reason": f"the job's torchhpc supervisor (pid {pid}) was killed before it recorded an end"}


def _make_job_dir(d: Path, output_dir: str, name: str) -> None:
    """The job's directory: in the store, or with ``--output-dir DIR`` at ``DIR/<name>-<id>/`` (as a Slurm
    job's) with the store's entry a link to it, so every reader (status, logs, diagnose) finds it by id."""
    if output_dir in ("", "."):
        d.mkdir(parents=True, exist_ok=False)
        return
    target = Path(output_dir).expanduser().absolute() / name
    try:
        target.mkdir(parents=True, exist_ok=False)
    except OSError as e:
        raise SchedulerError(f"--output-dir {output_dir}: cannot create {target} ({e.strerror})",
                             "give a directory you can write") from None
    d.parent.mkdir(parents=True, exist_ok=True)
    d.symlink_to(target, target_is_directory=True)


def _stop_orphans(job_id: str) -> list[int]:
    """Stop the ranks a killed torchhpc process left behind: each rank leads its own session (so a
    terminal's Ctrl-C reaches torchhpc only), so they outlive a SIGKILL of their parent. A job recorded
    as ended must not go on computing.

    Only a rank is stopped: a process whose environment names this run (``TORCHELASTIC_RUN_ID``), that
    leads its own process group and session as the runner starts ranks, and that no Slurm daemon
    started (a Slurm job submitted from that environment inherits the variable; its group may be
    slurmd's own, which must never be signalled).
    """
    mark = f"TORCHELASTIC_RUN_ID={run_id_of(job_id)}".encode()
    ranks = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            pid = int(entry.name)
            if mark not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            if os.getpgid(pid) != pid or os.getsid(pid) != pid or _under_a_daemon(pid):
                continue
            ranks.append(pid)
        except (OSError, ValueError):
            continue
    for pid in ranks:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(pid, sig)
            except OSError:
                break
            time.sleep(0.5 if sig == signal.SIGTERM else 0)
    return sorted(ranks)


def _under_a_daemon(pid: int) -> bool:
    """Whether a scheduler's daemon (slurmd, slurmstepd, ...) is among ``pid``'s ancestors."""
    seen = 0
    while pid > 1 and seen < 64:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        comm, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        if comm in ("slurmd", "slurmstepd", "pbs_mom", "kubelet"):
            return True
        pid, seen = int(rest[1]), seen + 1
    return False


def write_state(d: Path, data: dict[str, Any]) -> None:
    """The record, atomically; its ``reason`` one short line (a 300-line command in an error stays in the
    log, where ``logs`` and ``diagnose`` read it, not in every ``list``)."""
    reason = data.get("reason")
    if isinstance(reason, str) and (len(reason) > 240 or "\n" in reason):
        first = reason.strip().splitlines()[0] if reason.strip() else ""
        data = {**data, "reason": first[:237] + "..." if len(first) > 240 or "\n" in reason.strip() else first}
    tmp = d / (RECORD + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, d / RECORD)


def update_state(d: Path, **values: Any) -> dict[str, Any]:
    """The record read again (its writer may have changed it since), with ``values`` set, written back."""
    rec = read_state(d)
    rec.update(values)
    write_state(d, rec)
    return rec


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, reaped later by its parent, counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


class LocalJobs:
    """The record store and the background supervisor's lifecycle."""

    # Popen objects of supervisors this process started: polled so they do not linger as zombies.
    _children: ClassVar[dict[str, subprocess.Popen[bytes]]] = {}

    def _create(self, submission: Submission, **values: Any) -> tuple[str, Path, dict[str, Any]]:
        """A new job directory with its record, in both stores (``values`` go into the local one)."""
        job_id = uuid.uuid4().hex[:10]
        d = job_dir(job_id)
        spec = submission.spec
        _make_job_dir(d, spec.output_dir, f"{spec.name}-{job_id}")
        record: dict[str, Any] = {
            "scheduler": "local", "job_id": job_id, "name": spec.name, "state": "PENDING",
            "nproc_per_node": spec.nproc_per_node, "submitted": time.time(), "cwd": os.getcwd(),
            **dependency_record(spec), **values,
        }
        write_state(d, record)
        # The shared record store too, so `torchhpc logs` finds the file and reads its [rankN]: prefixes.
        save_record(new_record("local", job_id, name=spec.name, launcher="local", output_path=str(d / LOG),
                               nproc_per_node=spec.nproc_per_node, **dependency_record(spec)))
        return job_id, d, record

    def start_here(self, submission: Submission) -> tuple[str, Path]:
        """A record for a run this process supervises itself (a foreground ``torchhpc run``): (id, output.log).

        Its output is kept in ``output.log`` like a background job's, so ``logs``, ``diagnose`` and the
        hang watch read a foreground run the same way; ``cancel`` sends SIGTERM to this process alone
        (never to its process group: that may be the user's shell pipeline).
        """
        job_id, d, _record = self._create(submission, state="RUNNING", pid=os.getpid(), started=time.time(),
                                          foreground=True)
        return job_id, d / LOG

    def end_here(self, job_id: str, state: str, exit_code: int, reason: str, *, ran: bool = True) -> None:
        """The end of a run :meth:`start_here` recorded; again with the final exit code once the verdict
        has chosen it (its class's code under --hang-timeout/--max-restarts), keeping the first end time.

        ``ran=False``: no rank ever started (its ``--after-ok`` job failed, or it was stopped while it
        waited): the start :meth:`start_here` wrote is dropped, so ``events`` shows no start, as for a
        background job that never started."""
        d = job_dir(job_id)
        rec = read_state(d)
        rec.update(state=state, exit_code=exit_code, reason=reason)
        if not ran:
            rec.pop("started", None)
        rec.setdefault("ended", time.time())
        write_state(d, rec)

    def submit(self, submission: Submission) -> str:
        job_id, d, record = self._create(submission)
        with open(d / SUBMISSION, "wb") as f:
            pickle.dump(submission, f)
        with open(d / LOG, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "torchhpc.supervisor.background", str(d)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        self._children[job_id] = proc
        record.update(pid=proc.pid)
        # The supervisor may already have written RUNNING: merge, do not overwrite its state.
        current = read_state(d)
        current.setdefault("pid", proc.pid)
        write_state(d, {**record, **current})
        return job_id

    def status(self, job_id: str) -> JobStatus:
        d = job_dir(job_id)
        child = self._children.get(job_id)
        if child is not None:
            child.poll()
        rec = read_state(d)
        state = str(rec.get("state", "PENDING"))
        if state in ("PENDING", "RUNNING"):
            pid = _pid(rec, d)
            if pid and not _alive(pid):
                rec = read_state(d)  # it may have written its state just before exiting
                state = str(rec.get("state", "PENDING"))
                if state in ("PENDING", "RUNNING"):
                    state = "FAILED"
                    rec.update(_vanished(rec, d, pid), state=state)
                    write_state(d, rec)  # the first reader makes the end durable: events and diagnose read it too
                    _stop_orphans(job_id)
        end = rec.get("ended") or time.time()
        start = rec.get("started") or rec.get("submitted") or end
        try:
            elapsed = max(0.0, float(end) - float(start))
        except (TypeError, ValueError):
            raise SchedulerError(
                f"the record of {Handle('local', job_id)} cannot be read: its times are not numbers", _UNREADABLE_HINT.format(d=d)
            ) from None
        return JobStatus(
            job_id=job_id, state=state, exit_code=rec.get("exit_code"), reason=str(rec.get("reason", "")),
            elapsed=f"{elapsed:.1f}s", name=str(rec.get("name", "")), nodes="localhost",
            log_dir=str(d.resolve()),  # its log, hang.json and fr/: with --output-dir, where the store's link points
        )

    def times(self, job_id: str) -> JobTimes:
        """The record's own clock: ``submitted``, ``started`` (the supervisor's start) and ``ended``."""
        st = self.status(job_id)
        rec = read_state(job_dir(job_id))
        start = clock(rec.get("started"))
        return JobTimes(
            submit=min(t for t in (clock(rec.get("submitted")), start, time.time()) if t is not None), start=start,
            end=clock(rec.get("ended")) if st.terminal else None, state=st.state, exit_code=st.exit_code,
            nodes="localhost", source="record",
        )

    def logs(self, job_id: str, rank: int | None = None) -> str:
        d = job_dir(job_id)
        read_state(d)
        try:
            text = (d / LOG).read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return text if rank is None else task_text(text, None, rank)

    def log_paths(self, job_id: str) -> list[str]:
        d = job_dir(job_id)
        read_state(d)
        return [str(d / LOG)]

    def cancel(self, job_id: str) -> None:
        d = job_dir(job_id)
        st = self.status(job_id)
        if st.terminal:
            return
        rec = read_state(d)
        pid = _pid(rec, d)
        if pid and _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                if rec.get("foreground"):  # a foreground run: its process, which stops its ranks itself
                    os.kill(pid, signal.SIGTERM)
                else:
                    os.killpg(pid, signal.SIGTERM)  # the supervisor leads its own session
        else:
            update_state(d, state="CANCELLED", reason="cancelled before it started", ended=time.time())

    def prune(self, days: float) -> list[str]:
        """Remove ended jobs whose end is older than ``days``; a job still running (or unreadable) stays.
        With --output-dir the store's link goes and the files the user asked for stay where they are."""
        import shutil

        cutoff = time.time() - days * 86400
        gone = []
        for st in self.list_jobs():
            if not st.terminal:
                continue
            d = job_dir(st.job_id)
            ended = clock(read_state(d).get("ended"))
            if ended is None or ended > cutoff:
                continue
            if d.is_symlink():
                d.unlink()
            else:
                shutil.rmtree(d, ignore_errors=True)
            forget_record("local", st.job_id)
            gone.append(st.job_id)
        return gone

    def list_jobs(self) -> list[JobStatus]:
        """Every local job with a record, oldest submitted first (``list --last`` is the run just made); a
        record that cannot be read is skipped, said on stderr. Not by the record's mtime: reading a job's
        status may write its record (a supervisor found gone is recorded FAILED), and an older job then
        sorted last."""
        root = jobs_root()
        if not root.is_dir():
            return []
        dirs: list[tuple[float, Path]] = []
        for p in root.iterdir():
            try:
                mtime = (p / RECORD).stat().st_mtime
            except OSError:  # no record (not a job directory), or removed meanwhile
                continue
            try:
                submitted = clock(read_state(p).get("submitted"))
            except SchedulerError:
                submitted = None  # unreadable: status() below says so
            dirs.append((mtime if submitted is None else submitted, p))
        out = []
        for _mtime, p in sorted(dirs):
            try:
                out.append(self.status(p.name))
            except SchedulerError as e:
                print(f"Warning: skipped {Handle('local', p.name)}: {e.message}", file=sys.stderr)
        return out

