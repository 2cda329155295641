"""Functions as jobs: ``Executor(**job keywords).submit(fn, *args, **kwargs)`` -> :class:`FunctionJob`.

>>> ex = torchhpc.Executor(scheduler="slurm", nodes=2, nproc_per_node=2, launcher="srun")
>>> job = ex.submit(train, lr=0.1)       # fn's own keywords; the job's were given to Executor
>>> job.result()                         # rank 0's return value (results(): every rank's)

The job keywords are exactly :class:`torchhpc.job.Job`'s (scheduler, profile,
nodes, nproc_per_node, launcher, container, time, requeue...), and the job is a
program job underneath: every rank runs ``python -m torchhpc.functions.run DIR`` under
the job's launcher, container and scheduler, which starts the process group and
calls the function (see :mod:`torchhpc.functions.run`). Each submission has one home, as submitit's
``folder=``: ``<folder>/<name>-fn-<stamp>/`` holds the function, its arguments, the
submitting side's versions and the results (:mod:`torchhpc.functions.pack`), and is
the job's output directory, so the scheduler's job directory (``<name>-<id>/``: script,
logs) lies inside it. ``folder`` defaults to ``output_dir`` when that is given, else
:data:`DEFAULT_FOLDER`: a notebook that submits 100 functions leaves one directory in
the working directory, not 200. The ranks must see the folder at the same path (it is
shared for the logs already); on Kubernetes it must lie on a PVC
(``options={"pvc": "CLAIM:/mnt/x"}``, ``folder="/mnt/x/..."``).

A rank's exception comes back as :class:`torchhpc.JobFailed` with ``rank`` (the
first that raised), ``host`` and ``remote_traceback``. A function taking a
:class:`torchhpc.Stop` checkpoints and is requeued (:mod:`torchhpc.functions.requeue`).
Nothing here imports torch; cloudpickle is imported at submit.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import sys
import time
from collections.abc import Iterable
from typing import Any, Callable, Optional

from torchhpc.core.spec import Entrypoint, JobSpec
from torchhpc.core.units import plural
from torchhpc.errors import JobFailed, SpecError, WaitTimeout
from torchhpc.functions.pack import FunctionDir, atomic_write, check_picklable, dumps, load_cloudpickle, submit_versions
from torchhpc.functions.requeue import stop_parameter
from torchhpc.job import Job, JobHandle
from torchhpc.schedulers import scheduler_class
from torchhpc.schedulers.api import JobStatus, Submission

__all__ = ["DEFAULT_FOLDER", "Executor", "FunctionJob"]

RUNNER = "torchhpc.functions.run"
POD_SCRIPT = "run.py"
# Where an Executor given neither folder= nor output_dir= puts its submissions (one directory in the cwd).
DEFAULT_FOLDER = "torchhpc-jobs"
# After a rank's failure is recorded, how long the launcher gets to end the job by itself before cancel().
FAILED_JOB_GRACE = 30.0


class Executor:
    """Submits Python functions as distributed jobs; keywords are :class:`~torchhpc.job.Job`'s."""

    def __init__(self, folder: Optional[str | os.PathLike[str]] = None, **job_keywords: Any) -> None:
        """``folder``: every submission's directory goes under it (default: ``output_dir``, else :data:`DEFAULT_FOLDER`)."""
        if "program" in job_keywords or "module" in job_keywords:
            raise TypeError("Executor() takes job keywords only: the program is the function given to submit()")
        self.job_keywords = dict(job_keywords)
        self._job()  # unknown keywords and bad values fail here, not at the first submit
        self.folder = _folder(folder, self.job_keywords)

    def update_parameters(self, **job_keywords: Any) -> None:
        """Change job keywords (and ``folder``) for later submissions (submitit's spelling)."""
        folder = job_keywords.pop("folder", None)
        merged = {**self.job_keywords, **job_keywords}
        self._job(merged)
        self.job_keywords = merged
        if folder is not None or "output_dir" in job_keywords:
            self.folder = _folder(folder, merged)

    # --- submission ---------------------------------------------------------------------------------
    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> FunctionJob:
        """Run ``fn(*args, **kwargs)`` on every rank; the handle's ``result()`` is rank 0's value."""
        return self._submit(fn, args, kwargs, None, None)[0]

    def map_array(self, fn: Callable[..., Any], iterable: Iterable[Any], parallelism: Optional[int] = None) -> list[FunctionJob]:
        """One array job whose task i calls ``fn(items[i])``; one handle per task, in order.

        ``parallelism``: at most this many tasks at once (Slurm ``%K``, PBS ``%K``, local K at a time).
        """
        items = list(iterable)
        if not items:
            return []
        if parallelism is not None and parallelism < 1:
            raise SpecError(f"map_array(parallelism={parallelism}) must be at least 1", "give a positive number, or None for no cap")
        return self._submit(fn, (), {}, items, parallelism)

    def render(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Submission:
        """The dry run of ``submit(fn, ...)``: what would be submitted, and where the pickle would live. Writes nothing."""
        spec, fdir, _ = self._prepare(fn, args, kwargs, None, None)
        return _with_note(self._as_job(spec).render(), spec, fdir)

    def _as_job(self, spec: JobSpec) -> Job:
        """The job of a prepared spec, whose errors name the keywords given to Executor (``time=``), not flags."""
        job = Job(spec, runner=self.job_keywords.get("runner"))
        job._given = {k: v for k, v in self.job_keywords.items() if k != "runner"}
        return job

    def _prepare(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], items: Optional[list[Any]],
        parallelism: Optional[int],
    ) -> tuple[JobSpec, FunctionDir, Optional[str]]:
        if not callable(fn):
            raise TypeError(f"submit() needs a function, not {type(fn).__name__}")
        stop_param = stop_parameter(fn)
        keywords = dict(self.job_keywords)
        keywords.setdefault("name", _job_name(fn))
        if stop_param and scheduler_class(keywords.get("scheduler", "local")).supports_requeue:
            keywords.setdefault("requeue", True)  # a checkpointable function means: come back after the stop
        spec = self._job(keywords).spec
        fdir = FunctionDir.new(self.folder, spec.name)
        spec = spec.with_(output_dir=str(fdir.path))  # the scheduler's job directory goes inside the submission's
        if _in_pods(spec):  # pods run a script: a two-line one beside the pickle, on the PVC
            entry = Entrypoint("script", str(fdir.path / POD_SCRIPT), (), spec.entrypoint.python)
        else:
            entry = Entrypoint("module", RUNNER, (str(fdir.path),), spec.entrypoint.python)
        spec = spec.with_(entrypoint=entry)
        if items is not None:
            last = len(items) - 1
            spec = spec.with_(array=(f"0-{last}" if last else "0") + (f"%{parallelism}" if parallelism else ""))
        spec = _visible_in_container(spec, fdir)
        if _in_pods(spec):
            _on_pvc(spec, fdir)
        return spec, fdir, stop_param

    def _submit(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], items: Optional[list[Any]],
        parallelism: Optional[int],
    ) -> list[FunctionJob]:
        spec, fdir, stop_param = self._prepare(fn, args, kwargs, items, parallelism)
        check_picklable(fn, args, kwargs, items)
        payload = dumps({"fn": fn, "args": args, "kwargs": kwargs, "items": items, "stop_param": stop_param})
        meta = {
            "versions": submit_versions(),
            "function": getattr(fn, "__qualname__", repr(fn)),
            # cloudpickle names the file of every function it sends by value "<dynamic-code>" (for
            # deterministic pickles); the rank puts this file back into the traceback it reports.
            "source_file": _source_file(fn),
            "world_size": spec.world_size,
            "tasks": None if items is None else len(items),
            "created": time.time(),
        }
        fdir.write(payload, meta)
        if _in_pods(spec):
            atomic_write(fdir.path / POD_SCRIPT, _pod_script(fdir).encode())
        try:
            handle = self._as_job(spec).submit()
        except BaseException:
            shutil.rmtree(fdir.path, ignore_errors=True)
            raise
        tasks: list[Optional[int]] = [None] if items is None else list(range(len(items)))
        return [FunctionJob(handle, fdir, spec.world_size, task=t) for t in tasks]

    def _job(self, keywords: Optional[dict[str, Any]] = None) -> Job:
        return Job(["-"], module=RUNNER, **(self.job_keywords if keywords is None else keywords))


def _folder(folder: Optional[str | os.PathLike[str]], keywords: dict[str, Any]) -> str:
    chosen = folder if folder is not None else keywords.get("output_dir") or DEFAULT_FOLDER
    text = os.fspath(chosen)
    if not text.strip():
        raise SpecError("Executor(folder='') names no directory", f"give a directory, or leave folder out for ./{DEFAULT_FOLDER}")
    return text


def _job_name(fn: Callable[..., Any]) -> str:
    name = getattr(fn, "__name__", "") or type(fn).__name__
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.") or "function"


def _pod_script(fdir: FunctionDir) -> str:
    """``python -m torchhpc.functions.run DIR`` as the script a pod runs (the path is repr'd: any character survives)."""
    return f"import sys\nfrom torchhpc.functions.run import main\n\nsys.exit(main([{str(fdir.path)!r}]))\n"


def _in_pods(spec: JobSpec) -> bool:
    """Its ranks run in pods (an image; the function directory reaches them on a PVC, not a shared path)."""
    return scheduler_class(spec.scheduler).runs_in_pods


def _visible_in_container(spec: JobSpec, fdir: FunctionDir) -> JobSpec:
    """Bind the function directory into the container when the working directory's bind does not cover it."""
    c = spec.container
    if c is None or _in_pods(spec):
        return spec
    path = str(fdir.path)
    covered = [os.getcwd(), *(b.split(":", 1)[0] for b in c.binds)]
    if any(path == d or path.startswith(d.rstrip("/") + "/") for d in covered):
        return spec
    return spec.with_(container=dataclasses.replace(c, binds=(*c.binds, path)))


def _on_pvc(spec: JobSpec, fdir: FunctionDir) -> tuple[str, str]:
    """The (claim, mount) holding the function directory; a pod sees nothing else of this machine's files."""
    path = str(fdir.path)
    for item in (spec.option("pvc") or "").split(","):
        claim, sep, given = item.strip().partition(":")
        mount = given.rstrip("/") or "/"
        if sep and claim and given.startswith("/") and (path == mount or path.startswith(mount.rstrip("/") + "/")):
            return claim, mount
    raise SpecError(
        f"the function's pickle would be written to {path}, which the {spec.scheduler} pods cannot see "
        f"(the folder is on no PVC of options pvc={spec.option('pvc') or '(none)'!r})",
        "mount a PVC here and in the pods at the same path, then give it: "
        "Executor(..., options={'pvc': 'CLAIM:/mnt/shared'}, folder='/mnt/shared/runs')",
    )


def _with_note(sub: Submission, spec: JobSpec, fdir: FunctionDir) -> Submission:
    where = f"function pickle: {fdir.pickle_path} (written at submit; results in {fdir.path}/results)"
    if _in_pods(spec):
        claim, mount = _on_pvc(spec, fdir)
        where += f", on PVC {claim} mounted at {mount} in every pod"
    return dataclasses.replace(sub, notes=(*sub.notes, where))


# --- the handle -------------------------------------------------------------------------------------
class FunctionJob:
    """A submitted function (or one task of ``map_array``): ``result``, ``results``, ``done``, ``wait``,
    ``cancel``, ``logs``, like a program job's handle."""

    def __init__(self, handle: JobHandle, fdir: FunctionDir, world_size: int, task: Optional[int] = None,
                 poll: float = 0.5) -> None:
        self.handle = handle
        self.function_dir = fdir
        self.world_size = world_size
        self.task = task
        self.poll = poll

    @property
    def job_id(self) -> str:
        return self._own_id()

    def __str__(self) -> str:
        own = f"{self.handle.scheduler.name}:{self._own_id()}"
        # A local array's tasks share the job's handle (no task id of their own): the handle stays one every
        # command accepts, the task beside it.
        return own if self.task is None or own.endswith(f"_{self.task}") else f"{own} (task {self.task})"

    def __repr__(self) -> str:
        return f"FunctionJob({self}, dir={str(self.function_dir.path)!r})"

    def _own_id(self) -> str:
        own = self.handle.scheduler.task_id(self.handle.job_id, self.task) if self.task is not None else None
        return own or self.handle.job_id  # Slurm knows each task by itself; a local array by the job

    def status(self) -> JobStatus:
        st = self.handle.scheduler.status(self._own_id())
        if self.task is not None and not st.terminal and self._complete(self.function_dir.records(self.task)):
            st = dataclasses.replace(st, state="COMPLETED")  # a local array task: its records say it ended
        return st

    def done(self) -> bool:
        return self.status().terminal

    def wait(self, timeout: Optional[float] = None) -> JobStatus:
        return self._settle(timeout)[0]

    def cancel(self) -> None:
        self.handle.scheduler.cancel(self._own_id())

    def logs(self, rank: Optional[int] = None) -> str:
        """This job's output (one rank's with ``rank``); a local array task's own lines only, read through
        the ``[task I] `` prefix of the log its tasks share."""
        own = self._own_id()
        if self.task is None or own != self.handle.job_id:
            return self.handle.scheduler.logs(own, rank=rank)
        from torchhpc.jobdir.logs import task_text

        return task_text(self.handle.scheduler.logs(own), self.task, rank)

    def result(self, timeout: Optional[float] = None) -> Any:
        """Rank 0's return value; a rank's exception as :class:`JobFailed` (``.rank``, ``.host``, ``.remote_traceback``)."""
        return self.results(timeout)[0]

    def results(self, timeout: Optional[float] = None) -> list[Any]:
        """Every rank's return value, in rank order."""
        try:
            st, records = self._settle(timeout)
        except KeyboardInterrupt:  # the wait stops, not the job: say so before the interpreter's own report
            print(f"torchhpc: interrupted while waiting for {self}; the job goes on (job.cancel() stops it)",
                  file=sys.stderr, flush=True)
            raise
        failures = sorted((r for r in records.values() if not r.get("ok")), key=lambda r: (r.get("time", 0), r["rank"]))
        if failures:
            raise _failed(self, failures[0], st)
        if not self._complete(records):
            raise self._no_result(st, records)
        cloudpickle = load_cloudpickle()
        return [cloudpickle.loads(records[r]["value"]) for r in range(self.world_size)]

    # --- waiting ------------------------------------------------------------------------------------
    def _complete(self, records: dict[int, dict[str, Any]]) -> bool:
        return all(r in records and records[r].get("ok") for r in range(self.world_size))

    def _settle(self, timeout: Optional[float]) -> tuple[JobStatus, dict[int, dict[str, Any]]]:
        """Wait for the job's end; a job whose rank failed but that lingers is cancelled (nothing left running).

        The end comes from the job's end marker first; the scheduler is asked on a backed-off
        schedule and to confirm (schedulers/waiting.py), the rank records are read between."""
        from torchhpc.schedulers.waiting import EndWatch

        sched = self.handle.scheduler
        watch = EndWatch(self.status, sched.end_dir(self._own_id()), poll=self.poll, controller=sched.queries_controller)
        start = time.monotonic()
        failed_at: Optional[float] = None
        read_at = -1.0
        records: dict[int, dict[str, Any]] = {}
        while True:
            st, fresh = watch.step()
            now = time.monotonic()
            if fresh or watch.ended or now - read_at >= self.poll:  # the records unpickle values: not every stat
                records, read_at = self.function_dir.records(self.task), now
            if st is not None and watch.ended:
                return st, self._final_records(st, records)
            if failed_at is None and any(not r.get("ok") for r in records.values()):
                failed_at = now
            if failed_at is not None and now - failed_at > FAILED_JOB_GRACE:
                self.cancel()
                return sched.wait(self._own_id(), timeout=60, poll=self.poll), self.function_dir.records(self.task)
            if timeout is not None and now - start > timeout:
                raise WaitTimeout(
                    f"{self} still {st.waiting_on() if st else 'not ended'} after {timeout:.0f}s (the wait timed out; the job goes on)",
                    f"call result() again to keep waiting, or cancel() it; its logs: {self}.logs()",
                )
            time.sleep(max(watch.pause(), min(self.poll, 0.1)))

    def _final_records(self, st: JobStatus, records: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
        """A shared filesystem may show a rank's record a moment after the scheduler shows the end."""
        deadline = time.monotonic() + (5.0 if st.ok else 2.0)
        while not self._complete(records) and not any(not r.get("ok") for r in records.values()) \
                and time.monotonic() <= deadline:
            time.sleep(0.2)
            records = self.function_dir.records(self.task)
        return records

    def _no_result(self, st: JobStatus, records: dict[int, dict[str, Any]]) -> JobFailed:
        missing = [r for r in range(self.world_size) if r not in records]
        shown = ", ".join(map(str, missing[:8])) + (" ..." if len(missing) > 8 else "")
        checkpointed = self.function_dir.state_path(0, self.task).exists()
        hint = (
            "the function returned a checkpoint but the job was not requeued: submit with requeue=True "
            "(and time=..., signal_before=...) or resubmit, which resumes from it"
            if checkpointed and st.state == "COMPLETED" else
            f"read the ranks' output: {self!r}.logs() (torchhpc logs {self})"
        )
        tail = st.told_reason.strip()
        return JobFailed(
            f"{self} ended {st.state}" + (f" ({tail})" if tail else "")
            + f" without a result from {plural(len(missing), 'rank')} {shown}", hint, rank=missing[0] if missing else None,
        )


def _failed(job: FunctionJob, rec: dict[str, Any], st: JobStatus) -> JobFailed:
    tb = str(rec.get("traceback") or "")
    last = next((line for line in reversed(tb.splitlines()) if line.strip()), f"{rec.get('type')}: {rec.get('message')}")
    return JobFailed(
        f"{job}: rank {rec['rank']} on {rec.get('host')} failed: {last} (job {st.state})",
        "the rank's traceback is in .remote_traceback; every rank's output: .logs()",
        rank=int(rec["rank"]), host=rec.get("host"), remote_traceback=tb,
    )


def _source_file(fn: Callable[..., Any]) -> Optional[str]:
    """The file that defines ``fn`` (a script's ``__main__``), or None (a notebook cell, a builtin)."""
    code = getattr(getattr(fn, "__wrapped__", fn), "__code__", None)
    name = getattr(code, "co_filename", "") if code is not None else ""
    return os.path.abspath(name) if name and not name.startswith("<") and os.path.exists(name) else None
