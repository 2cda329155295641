"""A local job's "allocation": this machine, whose processes are the ranks; a command on its one
node is a child process here."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Optional

from torchhpc.schedulers.allocation import Allocation, SchedulerView

__all__ = ["RUN_PREFIX", "LocalAllocation", "run_id_of"]

RUN_PREFIX = "local-"  # a local job's run id (TORCHELASTIC_RUN_ID) is this and its job id: how its ranks are found


def run_id_of(job_id: str) -> str:
    """A local job's run id, from its job id."""
    return RUN_PREFIX + job_id


class LocalAllocation(Allocation):
    here = True

    def __init__(self, scheduler: SchedulerView, job_id: str, env: Optional[Mapping[str, str]] = None) -> None:
        super().__init__(scheduler, job_id, env)
        run_id = self.env.get("TORCHELASTIC_RUN_ID", "")
        if not self.job_id and run_id.startswith(RUN_PREFIX):  # the local job this process runs in (local/ranks.py)
            self.job_id = run_id.removeprefix(RUN_PREFIX)

    def nodes(self, status: Any = None) -> list[str]:
        return ["localhost"]

    def rank_match(self) -> dict[str, str]:
        return {"TORCHELASTIC_RUN_ID": run_id_of(self.job_id)}  # the run id each rank's environment carries

    def on_nodes(self, argv: Sequence[str], nodes: Sequence[str]) -> list[str]:
        return list(argv)
