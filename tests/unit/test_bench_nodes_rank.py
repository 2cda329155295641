"""bench/nodes_rank.NodeRank: where a rank of ``torchhpc bench nodes`` stands and the lockstep its
measurements run in, on rank 0 of a one-rank gloo group in this process (the many-node runs:
tests/integration, on the dev cluster)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import need

need("torch")

from torchhpc.bench import nodes_plan  # noqa: E402
from torchhpc.bench.nodes import _parser  # noqa: E402
from torchhpc.bench.nodes_rank import NodeRank, natural_key  # noqa: E402


@pytest.fixture
def rank(one_rank_group: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[NodeRank]:
    """Rank 0 of a one-rank group (tests/unit/conftest.py) on node7."""
    from torchhpc.dist import context

    monkeypatch.setenv("SLURMD_NODENAME", "node7")
    try:
        yield NodeRank(_parser().parse_args(["--json", "unused.json", "--device", "cpu", "--size", "4K"]))
    finally:
        context.cleanup(barrier=False)  # the group is the fixture's: adopted, so cleanup only forgets it


def test_a_lone_rank_is_its_own_node_and_leader(rank: NodeRank) -> None:
    assert (rank.rank, rank.node, rank.nodes, rank.ranks_of, rank.leader) == (0, "node7", ["node7"], {"node7": [0]},
                                                                               {"node7": 0})
    assert not rank.shared and not rank.cuda and rank.size == 4096  # one node shares a kernel with no other
    assert sorted(["node10", "node2", "node1"], key=natural_key) == ["node1", "node2", "node10"]


def test_the_lockstep_measures_once_a_step_and_stops_at_its_cap(rank: NodeRank) -> None:
    seen: list[int] = []

    def count() -> int:
        seen.append(len(seen) + 1)
        return seen[-1]

    assert rank._lockstep(count, 3, slot=1, slots=2) == [1, 2, 3]  # one turn a step, whichever it is
    assert rank._lockstep(None, 2) == []  # a rank that only meets the others
    slow = rank._call_seconds(lambda: time.sleep(0.02))
    assert len(rank._lockstep(slow, 50, min_steps=2, cap=0.0)) == 2  # no step starts after the cap
    assert 0.02 <= slow() < 5


def test_stat_picks_the_best_call_or_the_median(rank: NodeRank, capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[Any] = [0.3, 0.1, 0.2]
    assert (rank.pick(calls, higher=True), rank.pick(calls, higher=False)) == (0.3, 0.1)
    rank.args.stat = "median"
    assert rank.pick(calls, higher=True) == rank.pick(calls, higher=False) == 0.2
    rank.say("2 nodes")
    assert capsys.readouterr().out == nodes_plan.PREFIX + "2 nodes\n"
