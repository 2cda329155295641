"""``torchhpc events`` counts and draws what happened (issue 51, item 7): a hang or a failure without
attempts.json is an incident, the plot of such a job has its bar and every plot a legend, the start
names the nodes the job started on, each exclusion appears once, and a fault the probe found says the
probe's interval bounds its detection. The attempts are in the supervisor's contract (test_events.py's)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import need
from torchhpc.diagnose.events import timeline
from torchhpc.diagnose.events_plot import plot_data
from torchhpc.schedulers.times import JobTimes

S = 1_800_000_000.0
ATTEMPTS: list[dict[str, Any]] = [
    {"attempt": 0, "nodes": ["node1", "node2"], "started": S + 2, "launched": S + 2, "first_line": S + 9,
     "fault": S + 50, "ended": S + 52, "class": "node-failure", "found_by": "probe", "excluded": ["node2"],
     "checkpoint_step": None, "probe_s": 2.0},
    {"attempt": 1, "nodes": ["node1", "node3"], "started": S + 53, "launched": S + 54, "first_line": S + 60,
     "ended": S + 120, "class": None, "found_by": "", "excluded": ["node2"], "checkpoint_step": 300},
]


def _times(state: str, nodes: str = "localhost") -> JobTimes:
    return JobTimes(submit=S, start=S + 1, end=S + 121, state=state, exit_code=0 if state == "COMPLETED" else 1,
                    nodes=nodes, source="record")


def test_a_hang_without_attempts_json_is_an_incident() -> None:
    hang = {"quiet_s": 20.0, "culprits": [1], "flight": []}
    tl = timeline("local:x", _times("CANCELLED"), [], hang_info=hang, hang_time=S + 100, now=S + 200)
    assert len(tl.account.incidents) == 1 and tl.account.incidents[0].klass == "hang", tl.account
    assert tl.account.ettr < 0.9 and "1 incident" in tl.render().splitlines()[-1], tl.render()
    assert "hang       rank 1 quiet for 20 s" in tl.render()


def test_a_failure_without_attempts_json_is_an_incident_and_a_success_is_not() -> None:
    failed = timeline("local:x", _times("FAILED"), [], now=S + 200)
    assert [i.klass for i in failed.account.incidents] == ["failure"], failed.account
    done = timeline("local:x", _times("COMPLETED"), [], now=S + 200)
    assert done.account.incidents == () and done.account.productive_s == 120.0


def test_the_plot_of_an_unsupervised_job_has_its_bar() -> None:
    tl = timeline("local:x", _times("FAILED"), [], now=S + 200)
    bars, marks = plot_data(tl)
    assert [(b.node, b.attempt, b.klass) for b in bars] == [("localhost", 0, "failure")]
    assert [(m.node, m.klass) for m in marks] == [("localhost", "failure")]


def test_every_plot_has_a_legend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    need("matplotlib", "the PNG needs the plot extra")
    import matplotlib.pyplot as plt

    from torchhpc.diagnose.events_plot import plot_timeline

    drawn: list[Any] = []
    monkeypatch.setattr(plt, "close", lambda fig=None: drawn.append(fig))
    for tl in (timeline("slurm:5", _times("COMPLETED", "node[1,3]"), ATTEMPTS, now=S + 200),
               timeline("local:x", _times("FAILED"), [], now=S + 200)):
        plot_timeline(tl, tmp_path / "ev.png")
        legend = drawn[-1].legends[0] if drawn[-1].legends else None  # the figure's own band, below the axis label
        assert legend is not None and [t.get_text() for t in legend.get_texts()][-1] == "fault"


def test_the_start_names_the_nodes_it_started_on_and_each_exclusion_appears_once() -> None:
    """sacct's NodeList of a job resized after a node loss is the end's (node[1,3]); it started on node[1-3]."""
    tl = timeline("slurm:5", _times("COMPLETED", "node[1,3]"), ATTEMPTS, now=S + 200)
    [start] = [e for e in tl.events if e.kind == "start"]
    assert start.nodes == ("node[1-3]",)
    assert [(e.attempt, e.nodes) for e in tl.events if e.kind == "exclude"] == [(0, ("node2",))]
    alone = timeline("slurm:6", _times("COMPLETED", "node[1,3]"), [], now=S + 200)
    assert [e.nodes for e in alone.events if e.kind == "start"] == [("node[1,3]",)]  # not split at its comma


def test_a_fault_the_probe_found_says_its_detection_bound() -> None:
    text = timeline("slurm:5", _times("COMPLETED"), ATTEMPTS, now=S + 200).render()
    assert "found by probe): detection <= 2 s (the probe's interval)" in text, text
    old = [{k: v for k, v in a.items() if k != "probe_s"} for a in ATTEMPTS]
    assert "detection <= the probe's interval (not recorded)" in timeline("slurm:5", _times("COMPLETED"), old).render()
