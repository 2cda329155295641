"""What a local job needs before a record is made or a rank starts, asked once, said in one line.

Both checks answer what used to fail late and loud: a dependency on a job that does not exist
waited forever (it never ends), and a container runtime missing from this machine made every rank
print "command not found" around the whole boot command, which became the job's reason.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torchhpc.core.handle import Handle
from torchhpc.core.spec import JobSpec
from torchhpc.errors import UnknownJob

__all__ = ["check_startable"]


def check_startable(spec: JobSpec, query_many: Callable[[Sequence[str]], Mapping[str, Any]]) -> None:
    """Refuse a job whose --after-* jobs are unknown (``query_many`` leaves them out) or whose container
    runtime is not on this machine's PATH."""
    if spec.after:
        known = query_many([d.job_id for d in spec.after])
        missing = [d for d in spec.after if d.job_id not in known]
        if missing:
            from torchhpc.core.depend import KINDS

            raise UnknownJob(
                "no job " + ", ".join(f"{Handle('local', d.job_id)} (from {KINDS[d.kind][0]})" for d in missing),
                "`torchhpc list` shows the local jobs; a dependency must be a job that exists",
            )
    if spec.container is not None:
        from torchhpc.containers import check_runtime_here

        check_runtime_here(spec.container)
