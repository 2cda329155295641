"""The scheduler contract: ``schedule(render(spec))``.

``render`` is pure: it returns an inert, printable :class:`Submission` (the
script or manifest, the command that would submit it, the files to write).
Printing it is the dry run. Only ``schedule`` touches a cluster, through the
injectable :class:`~torchhpc.core.proc.Runner`.
"""

from __future__ import annotations

import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, ClassVar, Optional

from torchhpc.core.handle import Handle
from torchhpc.core.proc import Runner, default_runner
from torchhpc.core.shell import join
from torchhpc.core.spec import JobSpec
from torchhpc.errors import TorchHPCError, WaitTimeout
from torchhpc.jobdir.files import Written, write_new
from torchhpc.schedulers.allocation import Allocation
from torchhpc.schedulers.capabilities import check
from torchhpc.schedulers.options import Option, with_defaults
from torchhpc.schedulers.options import resolve as resolve_options

if TYPE_CHECKING:  # the readers' value types: loaded where a job's state is read, never by a submission
    from torchhpc.schedulers.pending import Pending
    from torchhpc.schedulers.times import JobTimes

__all__ = ["TERMINAL", "UNENDED", "JobStatus", "Scheduler", "Submission"]

# States as Slurm names them; other backends map onto these.
# States in which a job has not ended yet, whatever the scheduler says its exit code is.
UNENDED = frozenset({"PENDING", "CONFIGURING", "RUNNING", "SUSPENDED"})
TERMINAL = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL", "DEADLINE"}
)


@dataclass(frozen=True)
class Submission:
    """Everything ``schedule`` would do, as data.

    ``files`` maps paths to contents written before ``argv`` runs; ``script``
    (if any) is also one of them, at ``script_path``.
    """

    scheduler: str
    spec: JobSpec
    argv: tuple[str, ...]
    script: Optional[str] = None
    script_path: Optional[str] = None
    files: tuple[tuple[str, str], ...] = ()
    stdin: Optional[str] = None
    notes: tuple[str, ...] = ()

    def write_files(self, private: bool = False) -> Written:
        """Write the script (and any other file), never over a file that exists (schedulers/files.py).

        ``private``: to new hidden files beside their paths, for a submit command that is given
        that name (the batch schedulers); otherwise each file takes its path when free, else
        ``NAME.N.EXT``. The answer says which, and ``remove()`` undoes it all.
        """
        return write_new(self.files, private=private)

    def _fate(self, path: str) -> str:
        """What becomes of the script's display name at submit: it is never written there (schedulers/files.py)."""
        if path != self.script_path:
            return ""
        if self.stdin:
            return " (its name only: the submit command reads it on standard input)"
        return " (its name only: at submit the script is kept in the job's directory)"

    def __str__(self) -> str:
        """The dry run: each file, then the submit command. torchhpc's boot copy (a container's or another
        Python's ranks use it) is one line: its files are the installed package's, hundreds of lines that
        would bury the script."""
        from torchhpc.launchers.boot import is_boot_copy

        parts: list[str] = []
        boot = [path for path, content in self.files if is_boot_copy(path, content)]
        for path, content in self.files:
            if path in boot:
                if path == boot[0]:
                    names = " ".join(os.path.basename(p) for p in boot)
                    parts.append(f"# --- {os.path.dirname(path)}/ --- torchhpc's boot copy, written at submit (not shown):")
                    parts.append(f"#     {names}: the installed torchhpc package's boot/ files")
                continue
            parts.append(f"# --- {path}{self._fate(path)} ---")
            parts.append(content.rstrip("\n"))
        if self.script is not None and not any(p == self.script_path for p, _ in self.files):
            parts.append(f"# --- {self.script_path or 'script'} ---")
            parts.append(self.script.rstrip("\n"))
        # a script with no file is one torchhpc runs itself (the local scheduler): nothing is submitted
        here = self.script is not None and self.script_path is None
        parts.append("# --- each rank runs (torchhpc run starts them) ---" if here else "# --- submit with ---")
        parts.append(join(self.argv) + ("  # the file above on standard input" if self.stdin and self.script_path else ""))
        parts.extend(f"# note: {n}" for n in self.notes)
        return "\n".join(parts) + "\n"


@dataclass
class JobStatus:
    """A job's state, normalised to Slurm's vocabulary."""

    job_id: str
    state: str
    exit_code: Optional[int] = None
    reason: str = ""
    elapsed: str = ""
    name: str = ""
    nodes: str = ""
    restarts: int = 0
    raw: dict[str, str] = field(default_factory=dict)
    log_dir: str = ""  # the job's directory (script, scheduler output, per-rank logs), when known
    # a job array's tasks (job_id ARRAY_TASK), when this status summarises an array
    tasks: list[JobStatus] = field(default_factory=list)

    def __post_init__(self) -> None:
        # A job that has not ended has no exit code. Slurm reports 0:0 for a pending or running job, and
        # `PENDING exit=0` reads as a success that never happened (status, --json, list).
        if self.state in UNENDED:
            self.exit_code = None

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    @property
    def ok(self) -> bool:
        return self.state == "COMPLETED" and (self.exit_code in (0, None))

    @property
    def told_reason(self) -> str:
        """The scheduler's reason, or "" where it gave none (Slurm prints ``None`` or ``(null)``)."""
        return "" if self.reason in ("None", "(null)") else self.reason

    def waiting_on(self) -> str:
        """``PENDING (Resources)``: the state, with the scheduler's reason while the job waits (a wait
        that times out on a pending job says why it never started, not only that it did not)."""
        if self.state == "PENDING" and self.told_reason:
            return f"{self.state} ({self.told_reason})"
        return self.state

    def elapsed_or_waited(self, waited: float) -> str:
        """A wait's progress: the job's own elapsed time, as `status` says it, once it has started;
        before that, how long this wait has been (the wait's seconds shown as ``elapsed`` beside
        `status`'s ``elapsed=1.9s`` read as a second truth about one job)."""
        if self.elapsed and self.state != "PENDING":
            return f"elapsed {self.elapsed}"
        return f"waited {waited:.0f}s"

    def line(self) -> str:
        bits = [f"{self.job_id}", self.state]
        if self.exit_code is not None:
            bits.append(f"exit={self.exit_code}")
        if self.told_reason:
            bits.append(f"reason={self.told_reason}")
        if self.elapsed:
            bits.append(f"elapsed={self.elapsed}")
        if self.nodes:
            bits.append(f"nodes={self.nodes}")
        if self.restarts:
            bits.append(f"restarts={self.restarts}")
        if self.log_dir:
            bits.append(f"dir={self.log_dir}")
        return " ".join(bits)


class Scheduler(ABC):
    """A backend fills in a few small methods; facts live in class attributes.

    What a backend can honour is declared below as ``supports_*`` attributes (the
    defaults are a batch scheduler's), read by the one check in
    :mod:`torchhpc.schedulers.capabilities`; ``render`` of every subclass runs that
    check first, so no caller can skip it. The other attributes say how the backend
    runs a job, so that callers ask it instead of comparing names.
    """

    name: ClassVar[str] = ""
    submit_command: ClassVar[str] = ""

    # What the backend honours (docs/capabilities.md). Without one, the flag is refused or converted.
    supports_multi_node: ClassVar[bool] = True
    supports_time_limit: ClassVar[bool] = True
    supports_requeue: ClassVar[bool] = False
    supports_spares: ClassVar[bool] = False  # the in-allocation supervisor (torchhpc.supervisor)
    supports_restarts: ClassVar[bool] = False
    supports_shrink: ClassVar[bool] = False  # go on with fewer nodes after a node loss (--min-nodes)
    supports_arrays: ClassVar[bool] = False
    supports_gpus: ClassVar[bool] = True
    supports_memory: ClassVar[bool] = True
    supports_cpus: ClassVar[bool] = True
    supports_cpus_per_gpu: ClassVar[bool] = True
    supports_container_options: ClassVar[bool] = True
    supports_setup: ClassVar[bool] = True
    supports_interactive_shell: ClassVar[bool] = False
    supports_dependencies: ClassVar[bool] = True  # Slurm --dependency, PBS -W depend, the local supervisor
    supports_rank_probe: ClassVar[bool] = False
    # How it runs a job.
    runs_here: ClassVar[bool] = False  # on this machine, in the foreground (or --background): no queue
    runs_in_pods: ClassVar[bool] = False  # an image in pods: the cluster's runtime, the image's files
    renders_script: ClassVar[bool] = False  # a batch script (network presets applied in the script)
    default_launcher: ClassVar[str] = "torchrun"
    # status asks a shared controller (sbatch's scontrol, qstat, the API server): waits back off
    queries_controller: ClassVar[bool] = True
    # --opt names the submit command reads from its own environment when not given (sbatch: $SBATCH_ACCOUNT)
    env_options: ClassVar[Mapping[str, str]] = {}

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        # render is the template method: a backend that overrode it would skip the capability check
        if "render" in cls.__dict__:
            raise TypeError(f"{cls.__name__} overrides Scheduler.render: implement _render, its hook, instead")

    def target(self) -> Optional[str]:
        """One line saying where jobs go when that is not the site's own scheduler (a dev cluster), else None.

        ``torchhpc run``, ``shell`` and ``bench`` print it on stderr and put it in their JSON.
        """
        return None

    def supported(self, spec: JobSpec) -> tuple[JobSpec, tuple[str, ...]]:
        """``spec`` as this scheduler can run it, with a note per conversion; refusals raise (see capabilities)."""
        return check(self, spec)

    def __init__(self, runner: Runner | None = None) -> None:
        self.runner = runner or default_runner()

    # --opt KEY=VALUE names this backend understands, typed (``torchhpc options NAME`` lists them)
    OPTIONS: ClassVar[dict[str, Option]] = {}

    def checked_options(self, spec: JobSpec, given: Mapping[str, str] | None = None) -> dict[str, str]:
        """The job's ``--opt`` values, checked: one error for an unknown name or an ill-typed value."""
        return resolve_options(self.name, self.OPTIONS.values(), spec.options_dict if given is None else given)

    def settings(self, spec: JobSpec, given: Mapping[str, str] | None = None) -> dict[str, str]:
        """The checked ``--opt`` values over the declared defaults: a default is written once, in its
        :class:`~torchhpc.schedulers.options.Option`, never again where it is used."""
        return with_defaults(self.OPTIONS.values(), self.checked_options(spec, given))

    def render(self, spec: JobSpec) -> Submission:
        """What would be submitted for ``spec``: the capability check, then the backend's :meth:`_render`.

        A template method, so that no backend and no caller can skip the check: the spec the
        backend renders is the converted one, and the conversions' notes join the dry run's.
        """
        spec, notes = self.supported(spec)
        sub = self._render(spec)
        extra = tuple(n for n in notes if n not in sub.notes)
        return replace(sub, notes=(*sub.notes, *extra)) if extra else sub

    @abstractmethod
    def _render(self, spec: JobSpec) -> Submission:
        """The backend's hook: ``spec`` (already checked and converted) as an inert :class:`Submission`."""

    @abstractmethod
    def schedule(self, submission: Submission) -> str:
        """Submit and return the job id."""

    def submit(self, spec: JobSpec) -> str:
        return self.schedule(self.render(spec))

    def start(self, submission: Submission) -> str:
        """Submit so that any process reads the job back: a queue's job (the local scheduler: in the background)."""
        return self.schedule(submission)

    def status(self, job_id: str) -> JobStatus:
        raise TorchHPCError(f"the {self.name} scheduler has no status command")

    def logs(self, job_id: str, rank: int | None = None) -> str:
        raise TorchHPCError(f"the {self.name} scheduler keeps no logs")

    def log_paths(self, job_id: str) -> list[str]:
        return []

    def cancel(self, job_id: str) -> None:
        raise TorchHPCError(f"the {self.name} scheduler cannot cancel jobs")

    def query_many(self, ids: Sequence[str]) -> dict[str, JobStatus]:
        """Several jobs' states in one question to the scheduler where it can (Slurm: one squeue;
        PBS: one qstat), else one :meth:`status` each. For callers that show many jobs at once
        (``status A B C``, a pipeline's steps); an id the scheduler does not know is left out."""
        out: dict[str, JobStatus] = {}
        for job_id in dict.fromkeys(ids):
            try:
                out[job_id] = self.status(job_id)
            except TorchHPCError:
                continue
        return out

    def list_jobs(self) -> list[JobStatus]:
        return []

    # -- questions only the backend can answer (callers ask these instead of comparing names) --------
    accepts_nodelist: ClassVar[bool] = False  # jobs can be pinned to named nodes (Slurm's --nodelist)

    @classmethod
    def native_flag(cls, word: str) -> str | None:
        """torchhpc's spelling of this scheduler's own submit flag ``word`` (sbatch's ``-p``: ``--partition NAME``),
        for the "unknown flag" error of a user typing their scheduler's habit; None: not one of its flags."""
        return None

    def preflight(self, spec: JobSpec) -> None:
        """Checks against the live cluster before submitting (Slurm: the GPUs per node its partition has).

        Raises :class:`~torchhpc.errors.SpecError` for a job that could never start; a check that
        cannot be asked (no client command here) passes, and the submit command judges.
        """
        return None

    def task_id(self, job_id: str, task: int) -> str | None:
        """The id this scheduler knows array task ``task`` of ``job_id`` by, or None when a task has none of its own."""
        return None

    def watches_hangs(self, spec: JobSpec) -> bool:
        """Whether the job applies ``--hang-timeout`` itself, with no client (the in-allocation supervisor,
        a local job's own process); else ``wait --hang-timeout`` watches it from outside."""
        return False

    # -- installation questions: the client commands here, the controller ------------------------------
    clients: ClassVar[tuple[str, ...]] = ()  # the client commands torchhpc runs for this scheduler

    def missing_clients(self) -> list[str]:
        """The scheduler's client commands that are not on PATH here."""
        return [c for c in self.clients if not self.runner.which(c)]

    def controller(self) -> tuple[bool, str]:
        """Whether the scheduler's controller answers, and its words ((True, "") where it cannot be asked)."""
        return True, ""

    def allocation_of(self, job_id: str, env: Mapping[str, str] | None = None) -> Allocation:
        """The running job's nodes as this scheduler reaches them (:mod:`~torchhpc.schedulers.allocation`);
        ``env``: the environment of a process inside the job (default: this one's)."""
        return Allocation(self, job_id, env)

    def node_names(self) -> list[str]:
        """The cluster's node names, to reject a typo before anything is queued ([]: cannot be asked)."""
        return []

    def explain_pending(self, st: JobStatus) -> Optional[Pending]:
        """Why a pending job waits, from the scheduler's own evidence (None: this scheduler cannot say)."""
        return None

    def times(self, job_id: str) -> JobTimes:
        """The job's submit/eligible/start/end on the scheduler's clock (:mod:`~torchhpc.schedulers.times`),
        at no more cost than :meth:`status`; a backend without a clock of its own answers its state alone."""
        from torchhpc.schedulers.times import JobTimes

        st = self.status(job_id)
        return JobTimes(state=st.state, exit_code=st.exit_code, nodes=st.nodes, source="status")

    def end_dir(self, job_id: str) -> Optional[str]:
        """The directory where the job leaves its end marker (:mod:`~torchhpc.jobdir.endmark`),
        when this machine sees it; None: the end is learnt from :meth:`status` alone."""
        return None

    def wait(
        self,
        job_id: str,
        *,
        poll: float = 1.0,
        timeout: float | None = None,
        progress: Callable[[JobStatus, float], None] | None = None,
    ) -> JobStatus:
        """Until a terminal state: the end marker first, :meth:`status` only to confirm it and on a
        backed-off schedule (:mod:`~torchhpc.schedulers.waiting`); ``progress`` sees each answer,
        and the last one at least every ``poll`` seconds."""
        from torchhpc.schedulers.waiting import EndWatch

        watch = EndWatch(lambda: self.status(job_id), self.end_dir(job_id), poll=poll,
                         controller=self.queries_controller)
        start = time.monotonic()
        shown = start
        while True:
            st, fresh = watch.step()
            now = time.monotonic()
            elapsed = now - start
            if progress and st is not None and (fresh or now - shown >= poll):
                progress(st, elapsed)
                shown = now
            if watch.ended and st is not None:
                return st
            if timeout is not None and elapsed > timeout:
                state = st.waiting_on() if st is not None else "not ended"
                raise WaitTimeout(
                    f"job {Handle(self.name, job_id)} still {state} after {timeout:.0f}s (the wait timed out; the job goes on)",
                    f"`torchhpc status {Handle(self.name, job_id)}` to look again, `torchhpc cancel` to stop it",
                )
            time.sleep(watch.pause())
