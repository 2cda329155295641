"""The pending classifier on real output recorded from the dev cluster (tests/data/slurm/pending/README.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fakes import FakeRunner
from torchhpc.schedulers.pending import CATEGORIES, Pending
from torchhpc.schedulers.slurm.parse import parse_scontrol
from torchhpc.schedulers.slurm.pending import classify, dependencies, explain, queries

DATA = Path(__file__).parent.parent / "data" / "slurm" / "pending"


def load(name: str) -> tuple[dict[str, str], dict[str, str]]:
    d = DATA / name
    job = parse_scontrol((d / "scontrol.txt").read_text())
    return job, {p.stem: p.read_text() for p in d.glob("*.txt") if p.stem != "scontrol"}


def of(name: str) -> Pending:
    return classify(*load(name))


@pytest.mark.parametrize("name, category", [
    ("resources", "resources"), ("priority", "priority"), ("dependency", "dependency"), ("held", "held"),
    ("begin_time", "begin_time"), ("reservation", "reservation"), ("limit", "limit"), ("never-limit", "never"),
    ("never-nodes", "never"), ("never-partition-down", "never"),
])
def test_each_recorded_job_gets_its_category(name: str, category: str) -> None:
    p = of(name)
    assert p.category == category and p.category in CATEGORIES
    assert p.lines()[0].startswith("pending: ") and p.evidence[0].startswith("Slurm's reason: ")
    assert set(p.to_json()) == {"category", "summary", "action", "evidence"}


def test_resources_names_what_the_nodes_are_doing_and_the_estimate() -> None:
    p = of("resources")
    text = "\n".join(p.evidence)
    assert "0 idle, 4 allocated, 0 drained, 0 down (of 4); it asks 2 nodes" in text
    assert "node[1-4]: job 15 (hog, root, 4 nodes, until 2026-11-26T03:38:02)" in text
    assert p.action == "nothing to change: Slurm expects it to start at 2026-11-26T03:38:02 on node[1-2]"


def test_priority_lists_the_jobs_ahead() -> None:
    p = of("priority")
    assert "jobs ahead of it in debug: 1 (16 want2 2 nodes)" in p.evidence


def test_dependency_gives_each_dependency_state() -> None:
    p = of("dependency")
    assert "dependency afterok:15: job 15 (hog) is RUNNING, Slurm marks it unfulfilled" in p.evidence
    assert p.action == "nothing to change: it starts when job 15 ends successfully"


def test_held_suggests_the_release() -> None:
    assert of("held").action == "scontrol release 19"


def test_limit_names_the_qos_limit_and_value() -> None:
    p = of("limit")
    assert p.summary == "held back by QOS pendtest's limit MaxTRESPerUser cpu=2"
    assert "your running jobs in QOS pendtest: 1 (5 first: 1 node, 2 CPUs)" in p.evidence


def test_a_job_over_the_limit_alone_can_never_run() -> None:
    p = of("never-limit")
    assert "it alone asks cpu=4, over MaxTRESPerUser cpu=2" in p.summary


def test_never_says_why() -> None:
    assert of("never-nodes").summary.endswith("it asks 10 nodes; partition debug has 4")
    assert of("never-partition-down").summary.endswith("partition debug is DOWN")


def test_reservation_gives_its_start() -> None:
    p = of("reservation")
    assert p.action is not None and "begins at 2026-11-26T04:39:17" in p.action


def test_no_evidence_no_action() -> None:
    """A reason with nothing behind it (the limit's QOS unreadable, no running jobs) suggests nothing."""
    job, answers = load("limit")
    p = classify(job, {**answers, "limit": "", "mine": ""})
    assert p.category == "limit" and p.action is None
    job, answers = load("priority")
    p = classify({**job, "StartTime": "Unknown"}, answers)
    assert p.category == "priority" and p.action is None
    assert classify({**job, "Reason": "SomethingNew"}, answers).category == "other"


def test_one_round_of_few_queries() -> None:
    job, _ = load("resources")
    assert sorted(queries(job)) == ["nodes", "queue", "use"]
    job, _ = load("dependency")
    assert sorted(queries(job)) == ["deps", "nodes", "queue", "use"]
    job, _ = load("limit")
    assert sorted(queries(job)) == ["limit", "mine", "nodes", "queue", "use"]
    assert queries(job)["limit"][:6] == ["sacctmgr", "-n", "-P", "show", "qos", "pendtest"]


def test_explain_runs_the_queries_through_the_runner() -> None:
    job, answers = load("resources")
    answers["use"] = _use({"node1": 4, "node2": 4, "node3": 4, "node4": 4})
    by_argv = {tuple(argv): answers[name] for name, argv in queries(job).items()}
    answer = lambda argv, _input: by_argv[tuple(argv)]  # noqa: E731
    runner = FakeRunner(responses={"sinfo": answer, "squeue": answer, "scontrol": answer})
    assert explain(runner, job) == classify(job, answers)
    assert sorted(argv[0] for argv, _ in runner.calls) == ["scontrol", "sinfo", "squeue"]


def test_dependency_field() -> None:
    assert dependencies("afterok:4(unfulfilled),afterany:5_1(failed)") == [
        ("afterok", "4", "unfulfilled"), ("afterany", "5_1", "failed")]


def _use(alloc: dict[str, int], mem: dict[str, int] | None = None) -> str:
    """``scontrol show node -o`` lines in Slurm 22.05's layout (written here, not recorded: the dev-cluster
    test tests/integration/test_pending.py::test_a_partly_used_node_with_room_fits reads the real one)."""
    return "".join(
        f"NodeName={n} Arch=x86_64 CoresPerSocket=1 CPUAlloc={a} CPUEfctv=4 CPUTot=4 CPULoad=0.50 "
        f"AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) NodeAddr=10.0.0.{i} NodeHostName={n} "
        f"Version=22.05.8 OS=Linux 6.1.0 #1 SMP RealMemory=23593 AllocMem={(mem or {}).get(n, 0)} FreeMem=N/A "
        f"Sockets=4 Boards=1 State={'MIXED' if a < 4 else 'ALLOCATED'} ThreadsPerCore=1 Partitions=debug\n"
        for i, (n, a) in enumerate(alloc.items()))


def _mixed(job_fields: dict[str, str], mem: dict[str, int] | None = None) -> Pending:
    """resources' job, with node1-3 running one 1-CPU task each (mixed) and node4 full."""
    job, answers = load("resources")
    nodes = answers["nodes"].replace("node1|allocated", "node1|mixed").replace("node2|allocated", "node2|mixed")
    nodes = nodes.replace("node3|allocated", "node3|mixed")
    use = _use({"node1": 1, "node2": 1, "node3": 1, "node4": 4}, mem)
    return classify({**job, "StartTime": "Unknown", **job_fields}, {**answers, "nodes": nodes, "use": use})


def test_a_partly_used_node_with_room_fits() -> None:
    p = _mixed({"NumNodes": "4-4", "NumCPUs": "4"})
    text = "\n".join(p.evidence)
    assert "0 idle, 3 partly used with room for it, 1 allocated, 0 drained, 0 down (of 4)" in text, text
    assert p.action == "--nodes 3 would fit the free nodes now"


def test_a_partly_used_node_without_room_does_not() -> None:
    assert "0 idle, 4 allocated" in "\n".join(_mixed({"NumNodes": "4-4", "NumCPUs": "16"}).evidence)  # 4 CPUs/node
    asks_mem = _mixed({"NumNodes": "4-4", "NumCPUs": "4", "MinMemoryNode": "20G"}, {"node1": 10000})
    assert "0 idle, 2 partly used with room for it, 2 allocated" in "\n".join(asks_mem.evidence)


def test_held_by_an_admin_suggests_nothing_a_user_can_do() -> None:
    """`scontrol hold` as an administrator: the user's own `scontrol release` would not be allowed."""
    job, answers = load("held")
    p = classify({**job, "Reason": "JobHeldAdmin"}, answers)
    assert (p.category, p.summary, p.action) == ("held", "held by an administrator", None)
