"""The Python API, the same objects the CLI uses.

>>> job = Job(["examples/pi.py"], scheduler="slurm", nodes=2, nproc_per_node=2, launcher="srun")
>>> print(job.render())          # the dry run
>>> handle = job.submit()        # schedule(render(spec))
>>> handle.wait().state
'COMPLETED'
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable

from torchhpc.core.proc import Runner
from torchhpc.core.spec import ContainerSpec, Entrypoint, JobSpec, env_pairs
from torchhpc.schedulers import get_scheduler
from torchhpc.schedulers.api import JobStatus, Scheduler, Submission

__all__ = ["Job", "JobHandle"]


@dataclass
class JobHandle:
    """A submitted job: ``status``, ``wait``, ``logs``, ``cancel``."""

    scheduler: Scheduler
    job_id: str

    def __str__(self) -> str:
        return f"{self.scheduler.name}:{self.job_id}"

    def status(self) -> JobStatus:
        return self.scheduler.status(self.job_id)

    def wait(
        self, timeout: float | None = None, poll: float = 1.0, progress: Callable[[JobStatus, float], None] | None = None
    ) -> JobStatus:
        return self.scheduler.wait(self.job_id, timeout=timeout, poll=poll, progress=progress)

    def logs(self, rank: int | None = None) -> str:
        return self.scheduler.logs(self.job_id, rank=rank)

    def cancel(self) -> None:
        self.scheduler.cancel(self.job_id)


class Job:
    """A job description plus the scheduler that will run it."""

    def __init__(
        self,
        program: Sequence[str] | JobSpec,
        *,
        module: str | None = None,
        env: dict[str, str] | None = None,
        container: ContainerSpec | None = None,
        options: dict[str, str] | None = None,
        runner: Runner | None = None,
        **fields: Any,
    ) -> None:
        if isinstance(program, JobSpec):
            self.spec = program
        else:
            self.spec = JobSpec(
                entrypoint=Entrypoint.parse(list(program), module=module),
                env=env_pairs(env or {}),
                container=container,
                options=tuple((options or {}).items()),
                **fields,
            )
        self.scheduler = get_scheduler(self.spec.scheduler, runner=runner)

    def render(self) -> Submission:
        return self.scheduler.render(self.spec)

    def submit(self) -> JobHandle:
        return JobHandle(self.scheduler, self.scheduler.schedule(self.render()))
