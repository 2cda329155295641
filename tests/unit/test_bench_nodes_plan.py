"""``bench nodes``: the planner (pairs, rounds, suspects, verdicts, budget), the job it renders, bad input.

The planner is pure, so the scenarios here are the real decisions; the job is
rendered by the real slurm and pbs backends (nothing submitted). The run on the
4-node dev cluster is tests/integration/test_bench_nodes.py.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.fakes import FakeRunner
from torchhpc.bench import nodes_plan as plan
from torchhpc.bench.nodes_job import make_spec, resolve_nodes
from torchhpc.cli.main import main
from torchhpc.core.spec import Entrypoint, JobSpec
from torchhpc.errors import UsageError
from torchhpc.schedulers import get_scheduler
from torchhpc.schedulers.api import Scheduler

NODES = ["node1", "node2", "node3", "node4"]


def test_ring_is_n_pairs_in_disjoint_rounds() -> None:
    assert plan.ring_pairs(["a"]) == [] and plan.ring_pairs(["a", "b"]) == [("a", "b")]
    assert plan.ring_pairs(NODES) == [("node1", "node2"), ("node2", "node3"), ("node3", "node4"), ("node4", "node1")]
    for n in (3, 4, 5, 16, 17, 256):
        ring = plan.ring_pairs([f"n{i}" for i in range(n)])
        rounds = plan.rounds_of(ring)
        assert len(ring) == n and sorted(p for r in rounds for p in r) == sorted(ring)
        assert len(rounds) == (2 if n % 2 == 0 else 3)
        for r in rounds:  # no node twice in a round: its pairs really run side by side
            names = [x for p in r for x in p]
            assert len(names) == len(set(names))
    assert plan.rounds_of(plan.ring_pairs(NODES)) == [[("node1", "node2"), ("node3", "node4")],
                                                      [("node2", "node3"), ("node4", "node1")]]


@pytest.mark.parametrize("n", [4, 16, 256])
def test_pair_count_is_linear_plus_log_not_quadratic(n: int) -> None:
    c = plan.plan_counts(n)
    assert (c["ring_pairs"], c["ring_rounds"]) == (n, 2)
    # the re-measure: the slow link, and the slow node once more with a good node, side by side
    assert (c["confirm_pairs"], c["confirm_rounds"], c["retry_pairs"], c["retry_rounds"]) == (1, 1, 2, 1)
    assert c["max_confirm_rounds"] == math.ceil(math.log2(n))
    assert c["all_pairs"] == n * (n - 1) // 2
    total = c["ring_pairs"] + c["confirm_pairs"] + c["retry_pairs"]
    assert total == n + 3
    if n > 4:
        assert total < c["all_pairs"] // 2
    # rounds (what costs time): constant for the ring, at most log2(N) for the confirmation
    assert c["ring_rounds"] + c["retry_rounds"] + c["max_confirm_rounds"] <= 3 + math.ceil(math.log2(n))


def test_the_docs_table_is_the_planners() -> None:
    docs = (Path(__file__).parents[2] / "docs" / "nodes.md").read_text()
    for n in (4, 16, 256):
        c = plan.plan_counts(n)
        row = (f"| {n} | {c['ring_pairs']} in {c['ring_rounds']} | {c['confirm_pairs']} in {c['confirm_rounds']} "
               f"(at most {c['max_confirm_rounds']} rounds) | {c['retry_pairs']} in {c['retry_rounds']} | "
               f"{c['all_pairs']} |")
        assert row in docs, row


def ring_run(values: Mapping[plan.Pair, float | None]) -> list[dict[str, object]]:
    return [{"pair": list(p), "stage": "ring", "busbw": v} for p, v in values.items()]


def slow3(base: float = 0.5, slow: float = 0.05) -> dict[plan.Pair, float | None]:
    """node3's link degraded: both of its ring pairs are slow."""
    return {p: (slow if "node3" in p else base) for p in plan.ring_pairs(NODES)}


def test_a_slow_node_is_the_only_suspect_and_is_confirmed_against_a_good_node() -> None:
    scores, med = plan.pair_scores(ring_run(slow3()), plan.ring_pairs(NODES))
    assert med == pytest.approx(0.5)  # the median node's best pair, not the median pair (0.275)
    bad, good = plan.suspects(NODES, scores, 0.7)
    assert bad == ["node3"] and good == ["node1", "node2", "node4"]
    # node3 has met node2 and node4 in the ring: its new partner is node1; node2-node4 is the reference
    confirm = plan.confirm_rounds(bad, good, scores, 4)
    assert confirm == [[("node3", "node1")]]
    assert plan.reference_pair(confirm[0], good) == ("node2", "node4")
    # the two slow ring pairs share node3: two re-measure rounds, each beside a reference pair
    slow = [p for p in plan.ring_pairs(NODES) if "node3" in p]
    assert plan.retry_rounds(slow, good, [("node1", "node2"), ("node4", "node1")], 2) == [
        ([("node2", "node3")], ("node4", "node1")), ([("node3", "node4")], ("node1", "node2"))]


def test_verdict_names_node3_and_only_node3() -> None:
    run = [*ring_run(slow3()),
           {"pair": ["node2", "node3"], "stage": "retry", "busbw": 0.06, "ref": 0.45},
           {"pair": ["node4", "node1"], "stage": "reference", "busbw": 0.45},
           {"pair": ["node3", "node1"], "stage": "confirm", "busbw": 0.04, "ref": 0.5}]
    scores, _ = plan.pair_scores(run, plan.ring_pairs(NODES))
    rows = plan.node_rows(NODES, {n: {"matmul": 10.0} for n in NODES}, [("matmul", "GFLOP/s")], scores, 0.7)
    pairwise = {r.node: r.verdict for r in rows if r.section == "pairwise"}
    assert pairwise == {"node1": "PASS", "node2": "PASS", "node3": "SLOW", "node4": "PASS"}
    assert all(r.verdict == "PASS" for r in rows if r.section == "node")
    text, names = plan.exclude_text(rows)
    assert names == ["node3"] and text.splitlines()[1:] == ["node3"]
    table = plan.format_table(rows)
    assert "node3            pair busbw" in table and "SLOW" in table


def test_half_the_ring_slow_and_a_noisy_healthy_pair() -> None:
    """Measured on the dev cluster under load: node3 degraded, node1-node2 slowed by load.

    The median ring pair (0.087) would have passed node3 (0.76); the median node does not, and
    node2 (both pairs slow) is cleared by its confirmation pair.
    """
    ring = {("node1", "node2"): 0.107, ("node3", "node4"): 0.065, ("node2", "node3"): 0.066, ("node4", "node1"): 0.545}
    scores, ref = plan.pair_scores(ring_run(ring), list(ring))
    assert ref == pytest.approx((0.107 + 0.545) / 2)
    bad, good = plan.suspects(NODES, scores, 0.7)
    assert bad == ["node2", "node3"] and good == ["node1", "node4"]
    confirm = plan.confirm_rounds(bad, good, scores, 4)
    assert confirm == [[("node2", "node4"), ("node3", "node1")]]
    run = [*ring_run(ring), {"pair": ["node2", "node4"], "stage": "confirm", "busbw": 0.41},
           {"pair": ["node3", "node1"], "stage": "confirm", "busbw": 0.06}]
    scores, _ = plan.pair_scores(run, list(ring))
    bad, good = plan.suspects(NODES, scores, 0.7)
    assert bad == ["node3"]
    # node1-node2 is slow between two good nodes now: re-measured (no two other good nodes are free)
    slow = [p for p in ring if (scores[p][0] or 0) < 0.7 and not set(p) & set(bad)]
    assert plan.retry_rounds(slow, good, [], 2) == [([("node1", "node2")], None)]
    run.append({"pair": ["node1", "node2"], "stage": "retry", "busbw": 0.5})
    rows = plan.node_rows(NODES, {}, [], plan.pair_scores(run, list(ring))[0], 0.7)
    assert [(r.node, r.verdict) for r in rows if r.verdict != "PASS"] == [("node3", "SLOW")]


def test_a_healthy_node_slow_in_its_ring_and_confirmation_is_measured_again() -> None:
    """Run 25 of the suite (load 9-14): node3 degraded to 1/10, and node2 slow in every pair it ran.

    node2 stays a suspect after its confirmation (0.251 GB/s against 1.2); it runs once more with
    its best good partner before it is named, and that pair clears it. Its other slow pair with a
    good node is then a pair of two good nodes, measured again before it could be called a link.
    node3, slow again, is named, alone.
    """
    ring = {("node1", "node2"): 0.196, ("node3", "node4"): 0.0244, ("node2", "node3"): 0.0241, ("node4", "node1"): 1.2}
    run = [*ring_run(ring), {"pair": ["node2", "node4"], "stage": "confirm", "busbw": 0.251},
           {"pair": ["node3", "node1"], "stage": "confirm", "busbw": 0.0239}]
    scores, _ = plan.pair_scores(run, list(ring))
    assert plan.suspects(NODES, scores, 0.7) == (["node2", "node3"], ["node1", "node4"])
    again = plan.remeasure_pairs(*plan.suspects(NODES, scores, 0.7), scores, 0.7)
    assert again == [("node2", "node4"), ("node3", "node4")]  # each suspect's best pair with a good node
    assert plan.retry_rounds(again, good := ["node1", "node4"], [], 3) == [([("node2", "node4")], None),
                                                                       ([("node3", "node4")], None)]
    run += [{"pair": ["node2", "node4"], "stage": "retry", "busbw": 0.9},
            {"pair": ["node3", "node4"], "stage": "retry", "busbw": 0.0245}]
    scores, _ = plan.pair_scores(run, list(ring))
    assert plan.suspects(NODES, scores, 0.7) == (["node3"], ["node1", "node2", "node4"])
    # the second time: node1-node2 is a slow pair of two good nodes now; the retried pairs are not asked again
    assert plan.remeasure_pairs(*plan.suspects(NODES, scores, 0.7), scores, 0.7, [("node2", "node4"), ("node4", "node3")]) == [("node1", "node2")]
    assert plan.retry_rounds([("node1", "node2")], good, [], 3) == [([("node1", "node2")], None)]
    run.append({"pair": ["node1", "node2"], "stage": "retry", "busbw": 1.1})
    rows = plan.node_rows(NODES, {}, [], plan.pair_scores(run, list(ring))[0], 0.7)
    assert [(r.node, r.verdict) for r in rows if r.verdict != "PASS"] == [("node3", "SLOW")]


def test_a_suspect_whose_every_pair_failed_is_not_measured_again() -> None:
    scores: dict[plan.Pair, tuple[float | None, float | None]] = {
        ("node1", "node2"): (1.0, 1.0), ("node2", "node3"): (None, None), ("node3", "node4"): (None, None),
        ("node4", "node1"): (1.0, 1.0), ("node3", "node1"): (None, None)}
    assert plan.suspects(NODES, scores, 0.7)[0] == ["node3"]
    assert plan.remeasure_pairs(*plan.suspects(NODES, scores, 0.7), scores, 0.7) == []


def test_a_busy_moment_is_cleared_by_the_same_moment_reference() -> None:
    """Ring round 1 hit by load from elsewhere: both its pairs slow; re-measured beside a reference, fine."""
    ring = {("node1", "node2"): 0.08, ("node3", "node4"): 0.09, ("node2", "node3"): 0.2, ("node4", "node1"): 0.22}
    run = [*ring_run(ring),
           {"pair": ["node1", "node2"], "stage": "retry", "busbw": 0.07, "ref": 0.075},
           {"pair": ["node3", "node4"], "stage": "retry", "busbw": 0.1, "ref": 0.11}]
    scores, _ = plan.pair_scores(run, list(ring))
    rows = plan.node_rows(NODES, {}, [], scores, 0.7)
    assert [r for r in rows if r.verdict != "PASS"] == []


def test_a_slow_pair_between_good_nodes_is_a_link() -> None:
    pairs: dict[plan.Pair, float | None] = {p: 0.5 for p in plan.ring_pairs(NODES)}
    pairs[("node1", "node2")] = 0.1
    scores, _ = plan.pair_scores(ring_run(pairs), plan.ring_pairs(NODES))
    rows = plan.node_rows(NODES, {}, [], scores, 0.7)
    assert [(r.node, r.check, r.verdict) for r in rows if r.verdict != "PASS"] == [("node1-node2", "link", "SLOW")]
    assert plan.exclude_text(rows)[1] == []  # a link is not a node to exclude
    bad, _ = plan.suspects(NODES, scores, 0.7)
    assert bad == []  # each end has a fast pair: nobody to confirm


def test_failed_pairs_and_checks_are_fail() -> None:
    pairs = {**slow3(), ("node3", "node4"): None, ("node2", "node3"): None}
    scores, _ = plan.pair_scores(ring_run(pairs), plan.ring_pairs(NODES))
    rows = plan.node_rows(NODES, {"node1": {"matmul": 10.0}, "node2": {"matmul": 10.0}, "node3": {"matmul": 10.0},
                                  "node4": {}}, [("matmul", "GFLOP/s")], scores, 0.7)
    got = {(r.node, r.check): r.verdict for r in rows}
    assert got[("node3", "pair busbw")] == "FAIL" and got[("node4", "matmul")] == "FAIL"
    assert got[("node4", "pair busbw")] == "PASS"


def test_confirmation_is_bounded_by_log_n_rounds() -> None:
    names = [f"n{i}" for i in range(16)]
    bad, good = names[:8], names[8:]
    rounds = plan.confirm_rounds(bad, good, [], 16)
    assert len(rounds) == 1 and len(rounds[0]) == 8  # 8 good nodes test 8 suspects at once
    rounds = plan.confirm_rounds(names[:14], names[14:], [], 16)
    assert len(rounds) == 4 and sum(len(r) for r in rounds) == 8  # the rest keep their ring verdict
    assert plan.confirm_rounds(["a"], [], [], 4) == []


def test_budget_too_small_is_a_usage_error_with_the_minimum() -> None:
    plan.check_budget(180, 4)
    with pytest.raises(UsageError) as e:
        plan.check_budget(10, 4)
    assert "--budget 10s is too small for 4 nodes" in e.value.message and "--budget" in (e.value.hint or "")
    assert plan.estimate_seconds(256) > plan.estimate_seconds(4)


def _Sched(name: str, nodes: str = "node1\nnode2\nnode3\nnode4\n") -> Scheduler:
    """The real backend, its commands answered by a fake runner (a 4-node cluster's sinfo)."""
    return get_scheduler(name, FakeRunner(responses={"sinfo": nodes}))


def test_resolve_nodes_checks_names_and_counts() -> None:
    assert resolve_nodes(_Sched("slurm"), None, "node[2-3]", env={}) == (2, ["node2", "node3"], False)
    with pytest.raises(UsageError, match="node9 is not a node of this cluster"):
        resolve_nodes(_Sched("slurm"), None, "node[3,9]", env={})
    with pytest.raises(UsageError, match="this cluster has 4 node"):
        resolve_nodes(_Sched("slurm"), 5, None, env={})
    with pytest.raises(UsageError, match="local scheduler"):
        resolve_nodes(_Sched("local"), 2, None, env={})
    with pytest.raises(UsageError, match="Slurm option"):
        resolve_nodes(_Sched("pbs"), None, "node1", env={})
    # inside salloc without --nodes: the allocation's nodes (salloc sets both variables)
    inside = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node[1-3]"}
    assert resolve_nodes(_Sched("slurm"), None, None, env=inside) == (
        3, ["node1", "node2", "node3"], True)


def test_job_spec_carries_the_worker_nodelist_and_a_time_limit(tmp_path: Path) -> None:
    base = JobSpec(Entrypoint("module", "x"), scheduler="slurm", launcher="srun", nproc_per_node=2)
    spec, path = make_spec(base, 2, ["node1", "node3"], size=64 << 20, iters=5, slow_ratio=0.7, budget=180,
                           out_dir=str(tmp_path), deadline=1e9)
    assert spec.entrypoint.target == "torchhpc.bench.nodes" and spec.nodes == 2
    assert spec.option("nodelist") == "node[1,3]" and spec.time == "4"
    assert path == str(tmp_path / "bench-nodes.json") and "--json" in spec.entrypoint.args


def test_cli_dry_run_renders_slurm_and_pbs(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TORCHHPC_DEVCLUSTER_DIR", str(tmp_path / "none"))  # no sinfo to ask
    assert main(["bench", "nodes", "--scheduler", "slurm", "--nodes", "4", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "#SBATCH --nodes=4" in out and "-m torchhpc.bench.nodes --size 67108864" in out
    assert "#SBATCH --ntasks-per-node=2" in out  # srun, two ranks per node for the intra-node check
    assert main(["bench", "nodes", "--scheduler", "pbs", "--nodes", "2", "-s", "1M", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "#PBS -l select=2" in out and "torchhpc.bench.nodes --size 1048576" in out


@pytest.mark.parametrize("argv, message", [
    (["--scheduler", "local", "--nodes", "2"], "with the local scheduler"),
    (["--scheduler", "slurm", "--nodes", "4", "--budget", "5"], "--budget 5s is too small"),
    (["--slow-ratio", "1.5"], "--slow-ratio 1.5 must be between 0 and 1"),
])
def test_bad_input_is_one_line_with_a_hint(argv: list[str], message: str, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHHPC_DEVCLUSTER_DIR", str(tmp_path / "none"))
    assert main(["bench", "nodes", *argv, "--out", str(tmp_path), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("Error: ") and message in err[0] and err[1].startswith("HINT: ")


def test_run_exclude_reads_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.txt").write_text("# from bench nodes\nnode3\nnode5\n")
    assert main(["run", "--scheduler", "slurm", "--nodes", "2", "--exclude", "@bad.txt", "--dry-run", "x.py"]) == 0
    assert "#SBATCH --exclude=node3,node5" in capsys.readouterr().out
    assert main(["run", "--scheduler", "slurm", "--exclude", "@missing.txt", "--dry-run", "x.py"]) == 2
    assert "HINT:" in capsys.readouterr().err


def _state(tmp_path: Path) -> Any:
    from torchhpc.devcluster import ClusterState

    names = {"node1": "p-node1", "node2": "p-node2", "node3": "p-node3", "ctl": "p-ctl"}
    return ClusterState(str(tmp_path), ["node1", "node2", "node3"], {}, names, "10.0.0.1", "10.0.0.0/24",
                        "", "", "", "", False)


def test_degrade_shapes_both_ends_of_the_nodes_veth_and_restore_removes_it(tmp_path: Path) -> None:
    from torchhpc.devcluster import degrade as dg

    shown = {"out": "qdisc noqueue 0: root refcnt 2"}

    def tc(argv: Sequence[str], _input: str | None) -> str:
        if "replace" in argv:
            shown["out"] = "qdisc tbf 8001: root refcnt 3 rate 100Mbit burst 125000b lat 50ms"
        if "del" in argv:
            shown["out"] = "qdisc noqueue 0: root refcnt 2"
        return shown["out"] if "show" in argv else ""

    runner = FakeRunner(responses={"tc": tc})
    assert dg.degrade(_state(tmp_path), "node3", "100mbit", runner) == 100e6
    calls = [argv for argv, _ in runner.calls]
    assert calls == [
        ["tc", "-n", "p-ctl", "qdisc", "replace", "dev", "vn3", "root", "tbf", "rate", "100000000bit",
         "burst", "125000", "latency", "50ms"],
        ["tc", "-n", "p-node3", "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", "100000000bit",
         "burst", "125000", "latency", "50ms"],
    ]
    assert dg.shaped(_state(tmp_path), runner) == {"node1": "100Mbit", "node2": "100Mbit", "node3": "100Mbit"}
    assert dg.restore(_state(tmp_path), "node3", runner) is True
    assert dg.restore(_state(tmp_path), "node3", runner) is False  # twice is fine
    assert dg.parse_rate("1gbit") == 1e9 and dg.parse_rate("50mbps") == 400e6
    for bad in ("fast", "10", "-1mbit", "1xbit"):
        with pytest.raises(UsageError, match="is not a link rate"):
            dg.parse_rate(bad)
    with pytest.raises(UsageError, match="'node9' is not a node") as e:
        dg.degrade(_state(tmp_path), "node9", "1mbit", runner)
    assert "node1, node2, node3" in (e.value.hint or "")
