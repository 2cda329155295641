"""The local scheduler: N ranks on this machine with torchrun's env contract.

It imitates a cluster rather than a notebook: every rank gets exactly the
variables a torchrun worker gets (so code, and torchhpc's own env detector,
cannot tell the difference), runs in its own session (``start_new_session``)
so a rank's children die with it, and a failing rank stops the whole job, as a
Slurm step does. The parent never imports torch: it is pure process
management, so its workers start ~0.1 s after the command, where torchrun's
agent first imports torch itself (~2 s here) and only then forks them.

``render`` is pure; its printable form is a bash equivalent of what ``run``
starts (each rank's env and command), which is the dry run.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, ClassVar, Optional

from torchhpc import __version__
from torchhpc.core.handle import Handle
from torchhpc.core.processes import RankProcesses, describe_exit, exit_status
from torchhpc.core.shell import Raw, assignment, join
from torchhpc.core.spec import JobSpec, default_python
from torchhpc.core.units import counted
from torchhpc.errors import JobFailed, SchedulerError, SpecError
from torchhpc.jobdir.layout import FR_DIR, FR_VAR, JOB_DIR_VAR
from torchhpc.launchers import get_launcher
from torchhpc.launchers.boot import boot_argv, boot_pythonpath
from torchhpc.schedulers.allocation import Allocation
from torchhpc.schedulers.api import JobStatus, JobTimes, Scheduler, Submission
from torchhpc.schedulers.local.jobs import LocalJobs
from torchhpc.schedulers.local.preflight import check_startable
from torchhpc.schedulers.options import Option, declare

__all__ = ["CONTRACT", "LocalScheduler", "describe_exit", "exit_status", "free_port", "new_run_id", "rank_env",
           "worker_argv"]

# torchrun's worker contract (torch/distributed/elastic/agent/server/local_elastic_agent.py),
# in its order. Every name is set for every rank.
CONTRACT = (
    "RANK",
    "LOCAL_RANK",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_NAME",
    "LOCAL_WORLD_SIZE",
    "WORLD_SIZE",
    "GROUP_WORLD_SIZE",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
)
# Per-rank names; the rest of CONTRACT is the same for every rank.
PER_RANK = ("RANK", "LOCAL_RANK", "ROLE_RANK")
# Left over from an enclosing torchrun, they would point our workers at the wrong place.
STALE = ("TORCHELASTIC_ERROR_FILE", "NODE_RANK", "TORCHHPC_JOB_DIR")  # an outer job's: never this run's
MASTER_ADDR = "127.0.0.1"


def free_port(host: str = MASTER_ADDR) -> int:
    """A TCP port nobody listens on now, found by binding port 0 (the kernel picks)."""
    import socket  # here, not at the top: the dry run and --help never need it

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def new_run_id() -> str:
    """A TORCHELASTIC_RUN_ID-style id, unique per run (torchrun's default is a uuid too)."""
    import uuid

    return "local-" + uuid.uuid4().hex[:12]


def rank_env(
    spec: JobSpec, rank: int, *, master_addr: str, master_port: str | int, run_id: str
) -> dict[str, str]:
    """The torchrun contract for one rank of a single-node job (pure)."""
    n = spec.nproc_per_node
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "GROUP_RANK": "0",
        "ROLE_RANK": str(rank),
        "ROLE_NAME": "default",
        "LOCAL_WORLD_SIZE": str(n),
        "WORLD_SIZE": str(n),
        "GROUP_WORLD_SIZE": "1",
        "ROLE_WORLD_SIZE": str(n),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": master_port if isinstance(master_port, str) else str(master_port),
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_RUN_ID": run_id,
        # No agent hosts a TCPStore here: rank 0 creates it, as with env:// outside torchrun.
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
    }


def _restart_env(spec: JobSpec, count: int) -> dict[str, str]:
    """Which attempt this is, as a supervised Slurm job's ranks and torchrun's workers are told."""
    if not spec.max_restarts:
        return {}
    return {"TORCHHPC_RESTART_COUNT": str(count), "TORCHELASTIC_RESTART_COUNT": str(count),
            "TORCHELASTIC_MAX_RESTARTS": str(spec.max_restarts)}


def common_env(spec: JobSpec) -> dict[str, str]:
    """Variables every rank gets besides the contract: unbuffered output, torchrun's thread default, the user's."""
    env = {"PYTHONUNBUFFERED": "1"}
    if spec.nproc_per_node > 1 and "OMP_NUM_THREADS" not in os.environ:
        # torchrun does the same: N ranks each using every core thrash a shared machine.
        env["OMP_NUM_THREADS"] = "1"
    env.update(spec.env_dict)
    if spec.container is None:  # in a container, worker_argv's boot_argv writes the boot directory there
        path = boot_pythonpath({**os.environ, **env})  # the exit cures (launchers/boot.py), unless switched off
        if path:
            env["PYTHONPATH"] = path
    return env


def _check(spec: JobSpec) -> None:
    if spec.nodes != 1:
        raise SpecError(
            f"--nodes={spec.nodes}: the local scheduler runs on this machine only (nodes=1)",
            "drop --nodes and use -n/--nproc-per-node for more ranks, or pick --scheduler slurm",
        )
    if spec.container is not None and spec.container.runtime == "pyxis":
        raise SpecError(
            "--runtime pyxis only works through srun (it is a Slurm plugin), not with the local scheduler",
            "pick --runtime podman, apptainer or charliecloud here, or --scheduler slurm",
        )
    if spec.array is not None and spec.max_restarts:
        raise SpecError(
            f"--max-restarts {spec.max_restarts}: the tasks of a local job array are separate runs; restarts "
            "follow one run",
            "drop --max-restarts, or run each task on its own (--env TORCHHPC_ARRAY_INDEX=I)",
        )
    get_launcher(spec.launcher).check("local")


def worker_argv(spec: JobSpec) -> list[str]:
    """The command every rank runs: the entrypoint, in the container and after setup lines, if any."""
    argv = spec.entrypoint.argv(python=default_python(spec))
    if spec.container is not None:
        from torchhpc.containers import wrap  # lazily: most local runs have no container

        argv = wrap(
            spec.container,
            boot_argv(argv),
            gpus=spec.gpus_per_node,
            gpu_kind=spec.gpu_kind,
            pass_env=[*CONTRACT, "PYTHONUNBUFFERED", "OMP_NUM_THREADS", "TORCHHPC_*", *spec.env_dict],
        )
    if spec.setup:
        # Setup lines (module load ...) are shell; run them, then exec the rank's command.
        script = "\n".join([*spec.setup, 'exec "$@"'])
        argv = ["bash", "-c", script, "torchhpc-local", *argv]
    return list(argv)


def _script(spec: JobSpec, argv: Sequence[str], fixed: Mapping[str, str]) -> str:
    """A bash equivalent of ``run``: what the dry run shows (and what would work if pasted)."""
    n = spec.nproc_per_node
    lines = [
        "#!/bin/bash",
        f"# Generated by torchhpc {__version__} (local scheduler): {counted(n, 'rank')} on this machine.",
        "# `torchhpc run` starts these itself: each rank in its own session, its output prefixed",
        "# [rankN]: , and when one rank fails the others are stopped (SIGTERM, then SIGKILL).",
    ]
    if "MASTER_PORT" in fixed:
        port: str = fixed["MASTER_PORT"]
    else:
        probe = 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
        lines.append("# MASTER_PORT: a free port, found by binding port 0")
        lines.append('MASTER_PORT="$(' + join([default_python(spec), "-c", probe]) + ')"')
        port = Raw('"$MASTER_PORT"')
    run_id = fixed.get("TORCHELASTIC_RUN_ID") or Raw("local-$$")
    shared: dict[str, str] = {
        **rank_env(spec, 0, master_addr=fixed.get("MASTER_ADDR", MASTER_ADDR), master_port=port, run_id=run_id),
        **common_env(spec),
    }
    for key in PER_RANK:
        del shared[key]
    lines += [f"export {k}" if v == f'"${k}"' else f"export {assignment(k, v)}" for k, v in shared.items()]
    for rank in range(n):
        per = " ".join(f"{k}={rank}" for k in PER_RANK)
        lines.append(f"{per} setsid {join(argv)} &")
    lines.append("wait")
    return "\n".join(lines) + "\n"


class LocalScheduler(Scheduler):
    """Runs the job in the foreground on this machine, like torchrun --standalone."""

    name = "local"
    submit_command = ""
    # capabilities (schedulers/capabilities.py): this machine, no queue; --cpus-per-proc becomes OMP_NUM_THREADS
    supports_multi_node = False
    supports_time_limit = False
    supports_arrays = True
    supports_memory = False
    supports_cpus = False
    supports_cpus_per_gpu = False
    supports_rank_probe = True
    supports_restarts = True  # attempt after attempt in its own process (supervisor/restarts.py)

    def watches_hangs(self, spec: JobSpec) -> bool:
        return True  # in the foreground run's process, or the background job's supervisor

    def run_background(self, job_dir: str, attempts: Callable[..., Any]) -> int:
        """The body of a background job's supervisor process (``torchhpc.supervisor.background``): run the
        submission kept in ``job_dir`` here, each attempt through ``attempts`` (restarts, the hang watch)."""
        from torchhpc.schedulers.local.detached import run_detached

        return run_detached(Path(job_dir), self, attempts)
    runs_here = True
    queries_controller = False  # status reads the job's own record file

    def allocation_of(self, job_id: str, env: Mapping[str, str] | None = None) -> Allocation:
        from torchhpc.schedulers.local.allocation import LocalAllocation

        return LocalAllocation(self, job_id, env)

    OPTIONS = declare(
        Option("master_port", "fixed MASTER_PORT instead of a free one (or --env MASTER_PORT=...)", "int"),
        Option("grace", "seconds between SIGTERM and SIGKILL when stopping ranks (0 to 3600)", default="3"),
    )
    grace: float = 3.0
    poll: float = 0.02
    # Runs finished by schedule() in this process, by run id (class-wide: get_scheduler makes new instances).
    _finished: ClassVar[dict[str, JobStatus]] = {}

    def _render(self, spec: JobSpec) -> Submission:
        _check(spec)
        argv = worker_argv(spec)
        fixed = self._fixed(spec)
        notes = [
            f"{counted(spec.nproc_per_node, 'rank')} on this machine, each running the command above with "
            "RANK=LOCAL_RANK=ROLE_RANK=0..{}".format(spec.nproc_per_node - 1),
        ]
        if "MASTER_PORT" not in fixed:
            notes.append("MASTER_PORT is a free port picked by binding when the job starts")
        if spec.array_spec is not None:
            notes.append(f"array {spec.array}: one such run per task, {spec.array_spec.parallel or 1} at a time, "
                         "with TORCHHPC_ARRAY_INDEX/COUNT set and {index} replaced in the arguments")
        return Submission(
            scheduler=self.name,
            spec=spec,
            argv=tuple(argv),
            script=_script(spec, argv, fixed),
            script_path=None,
            notes=tuple(notes),
        )

    def schedule(self, submission: Submission) -> str:
        """Run in the foreground (there is no queue here) and return the run id as the job id.

        Like a batch submission, a failed run is not an exception here: its
        state (FAILED, or CANCELLED when interrupted) and exit status are kept
        for :meth:`status` / :meth:`wait` in this process. ``run`` raises instead.
        """
        run_id = self._fixed(submission.spec).get("TORCHELASTIC_RUN_ID") or new_run_id()
        name = submission.spec.name
        start = time.monotonic()
        try:
            self.run(submission, run_id=run_id)
            st = JobStatus(run_id, "COMPLETED", exit_code=0, name=name)
        except JobFailed as e:
            state = "CANCELLED" if e.message.startswith("interrupted") else "FAILED"
            st = JobStatus(run_id, state, exit_code=e.exit_code, reason=e.message, name=name)
        st.elapsed = f"{time.monotonic() - start:.1f}s"
        st.nodes = "localhost"
        self._finished[run_id] = st
        return run_id

    def submit_background(self, submission: Submission) -> str:
        """Start the job in the background with a record (``torchhpc run --background``, ``Job.submit()``);
        its id works with status, logs, cancel, wait and list from any process (schedulers/local/jobs.py)."""
        _check(submission.spec)
        self._fixed(submission.spec)
        check_startable(submission.spec, self.query_many)
        return LocalJobs().submit(submission)

    def start_here(self, submission: Submission) -> tuple[str, str]:
        """A record and job directory for a foreground run this process supervises: (id, its output.log)."""
        check_startable(submission.spec, self.query_many)
        job_id, log = LocalJobs().start_here(submission)
        return job_id, str(log)

    def end_here(self, job_id: str, state: str, exit_code: int, reason: str, *, ran: bool = True) -> None:
        """The end of a run :meth:`start_here` recorded (``ran=False``: no rank started, no start kept)."""
        LocalJobs().end_here(job_id, state, exit_code, reason, ran=ran)

    def status(self, job_id: str) -> JobStatus:
        """A foreground run this process scheduled, else a background job's record."""
        st = self._finished.get(job_id)
        if st is not None:
            return st
        return LocalJobs().status(job_id)

    def times(self, job_id: str) -> JobTimes:  # the record's submitted/started/ended (local/jobs.py)
        return LocalJobs().times(job_id)

    def end_dir(self, job_id: str) -> str | None:
        """A background job's directory, where its supervisor leaves the end marker."""
        if job_id in self._finished:
            return None
        from torchhpc.schedulers.local.jobs import job_dir

        d = job_dir(job_id)
        return str(d) if d.is_dir() else None

    def logs(self, job_id: str, rank: int | None = None) -> str:
        if job_id in self._finished:
            raise SchedulerError(
                f"{Handle('local', job_id)} ran in the foreground: its output went to the terminal",
                "start it with `torchhpc run --background` (or Job.submit()) to keep a log",
            )
        return LocalJobs().logs(job_id, rank=rank)

    def log_paths(self, job_id: str) -> list[str]:
        return [] if job_id in self._finished else LocalJobs().log_paths(job_id)

    def cancel(self, job_id: str) -> None:
        if job_id in self._finished:
            return  # it has ended
        LocalJobs().cancel(job_id)

    def list_jobs(self) -> list[JobStatus]:
        """Every job with a record in the state directory (foreground and background), oldest first."""
        return LocalJobs().list_jobs()

    def prune(self, days: float) -> list[str]:
        """Forget ended jobs older than ``days``: their records and files; the ids forgotten."""
        return LocalJobs().prune(days)

    def run(
        self,
        submission: Submission,
        *,
        rank0_only: bool = False,
        stdout: Optional[IO[str]] = None,
        stderr: Optional[IO[str]] = None,
        run_id: str | None = None,
        dependencies: bool = True,
        log: Optional[IO[str]] = None,
        restart_count: int = 0,
        job_dir: str | None = None,
    ) -> int:
        """Start every rank, relay its output, stop all when one fails; 0 or :class:`JobFailed`.

        With ``--after-*`` jobs it first waits for them (``dependencies``; the background
        supervisor waits itself, recording why), and refuses to start when one can never be met.
        ``log`` receives every rank's prefixed lines as well (a foreground run's ``output.log``).
        ``restart_count``: the attempts before this one (``--max-restarts``, supervisor/restarts.py),
        given to the ranks as ``TORCHHPC_RESTART_COUNT`` and torchrun's ``TORCHELASTIC_RESTART_COUNT``.
        ``job_dir``: the run's directory, where the ranks' Flight Recorder dumps go (``fr/``).
        """
        spec = submission.spec
        if spec.after and dependencies:
            self._wait_dependencies(spec, stderr or sys.stderr)
        if spec.array is not None:  # one run per task (local/array.py)
            from torchhpc.schedulers.local.array import run_array

            def task(one: JobSpec, out: IO[str], err: IO[str]) -> object:
                return self.run(self.render(one), rank0_only=rank0_only, stdout=out, stderr=err)

            return run_array(task, submission, stdout=stdout, stderr=stderr)
        _check(spec)
        fixed = self._fixed(spec)
        port = fixed.get("MASTER_PORT") or str(free_port())
        addr = fixed.get("MASTER_ADDR", MASTER_ADDR)
        rid = run_id or fixed.get("TORCHELASTIC_RUN_ID") or new_run_id()
        base = {k: v for k, v in os.environ.items() if k not in STALE}
        base.update(common_env(spec))
        if job_dir:  # the job's directory, as the ranks read it (the checkpoint helper's record, the boot's marks)
            base[JOB_DIR_VAR] = job_dir
            base.setdefault(FR_VAR, os.path.join(job_dir, FR_DIR))
        envs = [
            {**base, **rank_env(spec, r, master_addr=addr, master_port=port, run_id=rid),
             **_restart_env(spec, restart_count)}
            for r in range(spec.nproc_per_node)
        ]
        grace = _grace(spec.option("grace"), self.grace)
        job = RankProcesses(
            list(submission.argv),
            envs,
            stdout=stdout or sys.stdout,
            stderr=stderr or sys.stderr,
            rank0_only=rank0_only,
            grace=grace,
            poll=self.poll,
            log=log,
        )
        return job.run()

    def _wait_dependencies(self, spec: JobSpec, err: IO[str]) -> None:
        from torchhpc.schedulers.dependencies import DependencyState, wait_dependencies

        check_startable(spec, self.query_many)

        def say(states: list[DependencyState]) -> None:
            print("torchhpc: waiting: " + "; ".join(s.line() for s in states if s.verdict == "waiting"),
                  file=err, flush=True)

        never = wait_dependencies(self, spec.after, progress=say)
        if never:
            raise JobFailed(
                "DependencyNeverSatisfied: " + "; ".join(s.line() for s in never),
                "the job did not start; `torchhpc logs` of the job it depends on says why that one failed",
            )

    @staticmethod
    def _fixed(spec: JobSpec) -> dict[str, str]:
        """Rendezvous values the user pinned (option or --env) rather than ones we pick."""
        env = spec.env_dict
        fixed = {k: env[k] for k in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID") if env.get(k)}
        port = spec.option("master_port")
        if port:
            fixed["MASTER_PORT"] = port
        if "MASTER_PORT" in fixed and not fixed["MASTER_PORT"].isdigit():
            raise SpecError(
                f"MASTER_PORT {fixed['MASTER_PORT']!r} (from --env or -o master_port) is not a port number",
                "give a number such as 29500, or leave it out to get a free port",
            )
        return fixed


def _grace(text: str | None, default: float) -> float:
    try:
        value = default if text is None else float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 3600:
        raise SpecError(f"-o grace={text!r} is not a number of seconds", "e.g. -o grace=3 (0 to 3600)")
    return value
