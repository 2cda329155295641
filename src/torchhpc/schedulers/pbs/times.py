"""A PBS job's own clock from the ``qstat -f`` attributes ``status`` already reads.

PBS Pro and Torque keep ``qtime`` (queued), ``etime`` (eligible), ``stime`` / Torque's
``start_time`` (started) and, once finished, ``obittime`` (PBS Pro) or ``comp_time`` (Torque);
``mtime`` (last modified) stands in for the end of a finished job that has neither.
"""

from __future__ import annotations

from collections.abc import Mapping

from torchhpc.schedulers.pbs.parse import status_from_attrs
from torchhpc.schedulers.times import JobTimes, clock

__all__ = ["times_from_attrs"]


def times_from_attrs(job_id: str, attrs: Mapping[str, str]) -> JobTimes:
    st = status_from_attrs(job_id, dict(attrs))
    submit = clock(attrs.get("qtime")) or clock(attrs.get("ctime"))
    start = clock(attrs.get("stime")) or clock(attrs.get("start_time"))
    end = None
    if st.terminal:
        end = clock(attrs.get("obittime")) or clock(attrs.get("comp_time")) or clock(attrs.get("mtime"))
    reason = attrs.get("comment", "") if st.state == "PENDING" else ""
    seen = clock(attrs.get("mtime")) or submit
    return JobTimes(
        submit=submit, eligible=clock(attrs.get("etime")), start=start, end=end, state=st.state,
        exit_code=st.exit_code, nodes=st.nodes, reasons=((seen, reason),) if reason and seen else (),
        source="qstat", raw=dict(attrs),
    )
