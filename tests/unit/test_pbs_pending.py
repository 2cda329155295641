"""The PBS pending explanation, from qstat -f attributes.

No PBS server runs here: tests/data/pbs/qstat_full_pending.txt is assembled by hand in qstat -f's
format from PBS's own comment strings (tests/data/pbs/README.md says where each comes from).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fakes import FakeRunner
from torchhpc.schedulers.pbs.parse import parse_qstat_full, status_from_attrs
from torchhpc.schedulers.pbs.pbs import PBSScheduler
from torchhpc.schedulers.pbs.pending import classify

TEXT = (Path(__file__).parent.parent / "data" / "pbs" / "qstat_full_pending.txt").read_text()
JOBS = parse_qstat_full(TEXT)


@pytest.mark.parametrize("job, category, words", [
    ("5101", "never", "ncpus; there are 50 in all"),
    ("5102", "resources", "waiting for ngpus: 4 of the 8 it asks are free"),
    ("5103", "dependency", "afterok:5102"),
    ("5104", "held", "held by its user"),
    ("5105", "limit", "User has reached queue gpu running job limit."),
    ("5106", "begin_time", "Tue Feb 14 06:00:00 2026"),
    ("5107", "priority", "top job"),
    ("5108", "never", "queue debug is not started"),
])
def test_each_comment_gets_its_category(job: str, category: str, words: str) -> None:
    full = f"{job}.pbsserver01"
    p = classify(full, JOBS[full])
    assert p.category == category and words in p.summary, p


def test_a_wrapped_comment_is_read_whole_and_the_estimate_is_evidence() -> None:
    p = classify("5102.pbsserver01", JOBS["5102.pbsserver01"])
    assert "ngpus: it asks 8, 4 available, 64 in all" in p.evidence
    assert p.action == "nothing to change: PBS expects it to start at Tue Feb 14 02:10:01 2026"


def test_held_by_user_suggests_qrls_and_no_evidence_no_action() -> None:
    assert classify("5104.pbsserver01", JOBS["5104.pbsserver01"]).action == "qrls 5104"
    assert classify("5107.pbsserver01", JOBS["5107.pbsserver01"]).action is None


def test_the_scheduler_explains_from_status_alone() -> None:
    """No second call: the qstat -f that status made carries the comment."""
    st = status_from_attrs("5102.pbsserver01", JOBS["5102.pbsserver01"])
    sched = PBSScheduler(runner=FakeRunner())
    p = sched.explain_pending(st)
    assert p is not None and p.category == "resources"
    assert sched.runner.calls == []  # type: ignore[attr-defined]
