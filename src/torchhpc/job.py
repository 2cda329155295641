"""The Python API, the same objects the CLI uses.

>>> job = Job(["examples/pi.py"], nproc_per_node=2)      # local, named "pi" like the CLI names it
>>> print(job.render())          # the dry run
>>> handle = job.submit()        # schedule(render(spec)); a local job starts in the background
>>> handle.wait().state
'COMPLETED'

``Job(..., profile="mn5", account="bsc98", ...)`` applies a site profile with the
CLI's precedence (keyword > ``TORCHHPC_*`` > profile > config file > default).
``container="img.sif"`` (with ``runtime=``, ``bind=``, ``container_env=``,
``cleanenv=``) and ``no_container=True`` mean what ``--container IMAGE`` and
``--no-container`` mean on the command line.

``Job(..., after=[handle])`` starts after those jobs ended well (``--after-ok``);
``after_any=`` and ``after_fail=`` as ``--after-any`` and ``--after-fail``.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import fields as dc_fields
from typing import TYPE_CHECKING, Any, Callable

from torchhpc.core.handle import Handle
from torchhpc.core.proc import Runner
from torchhpc.core.spec import ContainerSpec, JobSpec
from torchhpc.errors import SchedulerError, SpecError, TorchHPCError, UsageError, name_flag_as
from torchhpc.schedulers import get_scheduler, scheduler_class
from torchhpc.schedulers.api import JobStatus, Scheduler, Submission

if TYPE_CHECKING:
    from torchhpc.diagnose.verdict import Verdict

__all__ = ["Job", "JobHandle", "TaskHandle", "check_gpus", "check_program", "visible_gpus"]

# Keywords that go with container="IMAGE", as the CLI's --runtime, --bind, --container-env, --cleanenv.
_CONTAINER_KEYWORDS = ("runtime", "bind", "container_env", "cleanenv")
# Where the values builder and JobSpec name a field differently.
_RENAMED = {"max_timeout_requeues": "max_requeues"}
# Dependencies: after= (after-ok), after_any=, after_fail=; each a handle, an id or a list of them.
_AFTER_KEYWORDS = ("after", "after_any", "after_fail")
# Applied to the built spec as given (no flag of that name).
_DIRECT = ("setup", "cpus_per_task")


@dataclass
class _Known:
    """A job, or one task of an array job, as its scheduler knows it: ``status``, ``logs``."""

    scheduler: Scheduler
    job_id: str

    def __str__(self) -> str:
        return str(Handle(self.scheduler.name, self.job_id))

    def status(self) -> JobStatus:
        return self.scheduler.status(self.job_id)

    def logs(self, rank: int | None = None) -> str:
        return self.scheduler.logs(self.job_id, rank=rank)


@dataclass
class JobHandle(_Known):
    """A submitted job: ``status``, ``wait``, ``logs``, ``cancel``."""

    def wait(
        self, timeout: float | None = None, poll: float = 1.0, progress: Callable[[JobStatus, float], None] | None = None
    ) -> JobStatus:
        return self.scheduler.wait(self.job_id, timeout=timeout, poll=poll, progress=progress)

    def cancel(self) -> None:
        self.scheduler.cancel(self.job_id)

    def diagnose(self) -> Verdict:
        """Why the job failed: the class, the first rank that failed, its host, error and file:line."""
        from torchhpc.diagnose.readback import diagnose_job

        return diagnose_job(self.scheduler, self.scheduler.name, self.job_id)

    def tasks(self) -> list[TaskHandle]:
        """An array job's tasks as handles with ``state``, ``logs()`` and ``result()``."""
        return tasks_of(self.scheduler, self.job_id, [int(t.job_id.rsplit("_", 1)[1]) for t in self.status().tasks])


@dataclass
class TaskHandle(_Known):
    """One task of an array job (``JOB_I``): ``state``, ``status()``, ``logs()``, ``result()`` (its last RESULT line)."""

    index: int

    @property
    def state(self) -> str:
        return self.status().state

    def result(self) -> dict[str, Any] | None:
        from torchhpc.core.array import last_result

        try:
            return last_result(self.logs())
        except SchedulerError:
            return None


def tasks_of(scheduler: Scheduler, job_id: str, indices: Sequence[int]) -> list[TaskHandle]:
    """Per-task handles of an array job (``JOB_I`` on Slurm; local arrays prefix lines ``[task I]`` instead)."""
    ids = [scheduler.task_id(job_id, i) for i in indices]
    if any(t is None for t in ids):
        raise SpecError(f"per-task handles are kept for slurm arrays, not {scheduler.name}",
                        "local arrays print each task's lines prefixed [task I]")
    return [TaskHandle(scheduler, str(t), i) for t, i in zip(ids, indices)]


class Job:
    """A job description plus the scheduler that will run it.

    ``program`` is the program and its arguments: a list (``["train.py", "--lr", "0.1"]``), one command line
    as a string (split as a shell would), a path, or a ready :class:`JobSpec`.

    Keywords are JobSpec fields (``nodes``, ``nproc_per_node``, ``launcher``,
    ``scheduler``, ``time``...), scheduler options (``account``, ``partition``,
    ``qos``, ``queue``, ``image``) and ``profile``.

    ``container`` is an image (``"img.sif"``, ``"docker://..."``, a name or a
    directory: the CLI's ``--container IMAGE``, its runtime from ``runtime=``,
    else the profile's, else apptainer; ``bind``, ``container_env`` and
    ``cleanenv`` as the CLI's flags) or a ready :class:`ContainerSpec`, used as
    given. ``no_container=True`` runs on the host even when the profile names a
    container runtime (``--no-container``).
    """

    def __init__(
        self,
        program: Sequence[str] | str | os.PathLike[str] | JobSpec,
        *,
        module: str | None = None,
        env: dict[str, str] | None = None,
        container: ContainerSpec | str | os.PathLike[str] | None = None,
        no_container: bool = False,
        options: dict[str, str] | None = None,
        runner: Runner | None = None,
        profile: str | None = None,
        **fields: Any,
    ) -> None:
        from torchhpc.config import serve_slurm

        serve_slurm()  # the Slurm target the CLI takes: a running dev cluster where this machine has no Slurm
        self._given = {} if isinstance(program, JobSpec) else dict(fields)  # errors name these keywords
        if isinstance(program, JobSpec):
            self.spec = program
        else:
            self.spec = _spec(_argv(program), module, env, container, no_container, options, profile, fields)
        self.scheduler = get_scheduler(self.spec.scheduler, runner=runner)

    def render(self) -> Submission:
        try:
            return self.scheduler.render(self.spec)
        except TorchHPCError as e:  # what the scheduler refuses (time= locally), named as the caller wrote it
            raise _as_written(e, self._given) from None

    def submit(self) -> JobHandle:
        try:
            check_program(self.spec)
            check_gpus(self.spec, self.scheduler.runner)
            submission = self.render()
            warning = no_gpu_warning(self.spec)
            if warning:
                print(warning, file=sys.stderr)
            return JobHandle(self.scheduler, self.scheduler.start(submission))
        except TorchHPCError as e:
            raise _as_written(e, self._given) from None


def _argv(program: Sequence[str] | str | os.PathLike[str]) -> list[str]:
    """The program's argv: a list as given; a path as one word; a string as one command line, split as a
    shell splits it (``Job("train.py --lr 0.1")``), never one argument per character."""
    if isinstance(program, os.PathLike):
        return [os.fspath(program)]
    if isinstance(program, str):
        import shlex

        try:
            words = shlex.split(program)
        except ValueError as e:
            raise UsageError(f"Job({program!r}): {e}", "give the program as a list: Job(['train.py', '--lr', '0.1'])") \
                from None
        if not words:
            raise UsageError("Job(''): no program", "give the program to run: Job(['examples/pi.py'])")
        return words
    return [os.fspath(w) for w in program]


def _spec(
    program: list[str],
    module: str | None,
    env: dict[str, str] | None,
    container: ContainerSpec | str | os.PathLike[str] | None,
    no_container: bool,
    options: dict[str, str] | None,
    profile: str | None,
    given: dict[str, Any],
) -> JobSpec:
    from torchhpc.resolve import _OPTION_KEYS, build_spec

    known = {f.name for f in dc_fields(JobSpec)} | set(_OPTION_KEYS) | set(_CONTAINER_KEYWORDS) | set(_AFTER_KEYWORDS)
    unknown = sorted(set(given) - known - {"entrypoint", "container", "env", "options"})
    if unknown:
        raise TypeError(f"Job() got unexpected keyword argument(s): {', '.join(unknown)}")
    values: dict[str, Any] = {_RENAMED.get(k, k): v for k, v in given.items() if k not in _DIRECT}
    for key in ("bind", "container_env"):
        if isinstance(values.get(key), str):
            values[key] = [values[key]]  # one bind, not one per character
    values.update(profile=profile, module=module, env=env or {}, opt=dict(options or {}))
    if isinstance(container, ContainerSpec):
        if no_container:
            raise UsageError("container= and no_container=True contradict each other", "give one of them")
        values["no_container"] = True  # given as an object: set below, not resolved from a profile
    elif container is None or isinstance(container, (str, os.PathLike)):
        # An image, as the CLI's --container IMAGE: build_spec picks the runtime (runtime=, the profile's, apptainer).
        values["container"] = None if container is None else os.fspath(container)
        values["no_container"] = no_container
    else:
        raise TypeError(f"Job(container=...) takes an image name or a ContainerSpec, not {type(container).__name__}")
    try:
        spec = build_spec(values, program)
    except TorchHPCError as e:  # run's words (--after-any 'x') -> the keyword the caller wrote (after_any='x')
        _as_written(e, given)
        raise
    direct = {k: given[k] for k in _DIRECT if k in given}
    if isinstance(container, ContainerSpec):
        direct["container"] = container
    return spec.with_(**direct) if direct else spec


def _as_written(e: TorchHPCError, given: dict[str, Any]) -> TorchHPCError:
    """``e`` with run's flags named as the keywords the caller gave (``--time 60`` -> ``time=60``)."""
    e.message = as_keywords(e.message, given, opens_with_value=True)
    e.hint = None if e.hint is None else as_keywords(e.hint, given)
    e.args = (e.message,)
    return e


def as_keywords(text: str, given: dict[str, Any], opens_with_value: bool = False) -> str:
    """``text`` in ``run``'s words (``--nodes=0 ...``, ``--after-ok 1``) with each flag of a keyword the
    caller gave named as that keyword (``nodes=0 ...``, ``after=1``): Job() has no flags."""
    for key in given:
        flags = ("--after-ok", "--after") if key == "after" else ("--" + _RENAMED.get(key, key).replace("_", "-"),)
        for flag in flags:
            if opens_with_value:  # an error's message opens with the flag and the value given
                text = re.sub("^" + re.escape(flag) + " ", key + "=", text)
            text = name_flag_as(text, flag, key, "=", value_opens="['\"\\d]")
    return text


def check_program(spec: JobSpec) -> None:
    """Refuse a program that cannot start, before anything is submitted.

    A script must exist (relative to the current directory, which is where
    the job starts), unless it runs in a container and names an absolute path
    that may live in the image: that is checked inside the image when the
    image is a directory (Charliecloud, enroot sandboxes). Pods (kubernetes,
    runai) run the image's files: nothing to check here. A command run
    locally must be on PATH.
    """
    runs = scheduler_class(spec.scheduler)
    if runs.runs_in_pods:
        return
    entry = spec.entrypoint
    if entry.kind == "script":
        target = entry.target
        if os.path.exists(target):
            return
        if spec.container is not None and os.path.isabs(target):
            image = str(spec.container.image)
            if not os.path.isdir(image) or os.path.exists(os.path.join(image, target.lstrip("/"))):
                return  # cannot look inside a SIF or a registry image from here
        raise SpecError(
            f"the program {target!r} does not exist (from {os.getcwd()})",
            "check the path: scripts are found relative to the directory you submit from",
        )
    if entry.kind == "command" and spec.container is None and runs.runs_here and shutil.which(entry.target) is None:
        raise SpecError(f"the command {entry.target!r} is not on PATH", "give its full path, or a script.py")


def visible_gpus(kind: str = "nvidia", root: str = "/") -> int:
    """GPUs this machine shows, from the driver's files (no torch import): NVIDIA's /proc entries, AMD's KFD nodes."""
    import glob

    if kind == "amd":
        n = 0
        for path in glob.glob(os.path.join(root, "sys/class/kfd/kfd/topology/nodes/*/gpu_id")):
            with contextlib.suppress(OSError):
                n += open(path).read().strip() not in ("", "0")
        return n
    found = glob.glob(os.path.join(root, "proc/driver/nvidia/gpus/*")) or glob.glob(os.path.join(root, "dev/nvidia[0-9]*"))
    return len(found)


def no_gpu_warning(spec: JobSpec) -> str | None:
    """The one warning line of a local run that asks for GPUs this machine does not show (it runs on CPU).

    Run, not refused: the same command is often tried here before it goes to a GPU cluster
    (docs/capabilities.md).
    """
    if not spec.gpus_per_node or not scheduler_class(spec.scheduler).runs_here or visible_gpus(spec.gpu_kind):
        return None
    return (f"Warning: --gpus-per-node {spec.gpus_per_node} but this machine shows no {spec.gpu_kind} GPU: "
            "the ranks run on CPU")


def check_gpus(spec: JobSpec, runner: Runner | None = None) -> None:
    """Refuse a job its cluster could never start (Slurm: more GPUs per node than the partition has).

    Args:
        spec: the job, its scheduler named by ``spec.scheduler``.
        runner: the command runner that reaches the cluster (default: this machine's).

    Raises:
        SpecError: the cluster cannot run it; skipped when the cluster cannot be asked.
    """
    get_scheduler(spec.scheduler, runner).preflight(spec)
