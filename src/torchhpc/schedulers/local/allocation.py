"""A local job's "allocation": this machine, whose processes are the ranks; a command on its one
node is a child process here."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torchhpc.schedulers.allocation import Allocation

__all__ = ["LocalAllocation"]


class LocalAllocation(Allocation):
    here = True

    def nodes(self, status: Any = None) -> list[str]:
        return ["localhost"]

    def rank_match(self) -> dict[str, str]:
        return {"TORCHELASTIC_RUN_ID": f"local-{self.job_id}"}  # the run id each rank's environment carries

    def on_nodes(self, argv: Sequence[str], nodes: Sequence[str]) -> list[str]:
        return list(argv)
