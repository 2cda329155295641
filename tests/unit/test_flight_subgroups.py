"""Flight Recorder verdicts beyond the world group (issue 65), from real gloo dumps.

The dumps in tests/data/flight_recorder/gloo<W>-<LAYOUT>-<MODE>/ were written by real 4- and 8-rank
gloo jobs of tests/integration/scripts/planted_subgroup.py (record_subgroups.py there says how):
subgroups as pairs, halves and strides made with ``new_group``, and the row and column groups of a
2 x W/2 DeviceMesh; one rank skips its subgroup's all_reduce, calls all_gather there, or passes
another size. gloo names no group in ``pg_config`` (``{'': {'ranks': '[]'}}``) and numbers each
rank's groups its own way (both pairs are "pg 1" on their ranks), so the members come from which
ranks' entries name each group, and the verdict must follow the chain: the partner waits in the
subgroup's call, so it never enters the world's, where everyone else waits for it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from torchhpc.diagnose.flight import FR_DIR, Finding, analyse, load_dumps, members, post_mortem
from torchhpc.diagnose.groups import chain, departs
from torchhpc.diagnose.hang_verdict import culprit, why_unread
from torchhpc.diagnose.probe import RankStack, why_no_stack

DATA = Path(__file__).parent.parent / "data" / "flight_recorder"


def recorded(case: str) -> tuple[dict[int, dict[str, Any]], set[int], int]:
    d = DATA / case
    left = set(load_dumps(str(d), "rank-", ".left"))
    dumps = {**load_dumps(str(d), "rank-"), **load_dumps(str(d), "rank-", ".left")}
    return dumps, left, int(case[4])


# (case, root kind, root rank, its group's members, the op, the ranks that wait for the consequence's rank)
SKIPS = [
    ("gloo4-pairs-skip", 3, (2, 3), (0, 1, 3), (2,)),
    ("gloo4-strides-skip", 3, (1, 3), (0, 2, 3), (1,)),
    ("gloo4-row-skip", 3, (2, 3), (0, 1, 3), (2,)),
    ("gloo4-col-skip", 3, (1, 3), (0, 2, 3), (1,)),
    ("gloo8-pairs-skip", 5, (4, 5), (0, 1, 2, 3, 5, 6, 7), (4,)),
    ("gloo8-halves-skip", 5, (4, 5, 6, 7), (0, 1, 2, 3, 5), (4, 6, 7)),
    ("gloo8-strides-skip", 5, (1, 5), (0, 2, 3, 4, 5, 6, 7), (1,)),
    ("gloo8-row-skip", 5, (4, 5, 6, 7), (0, 1, 2, 3, 5), (4, 6, 7)),
    ("gloo8-col-skip", 5, (1, 5), (0, 2, 3, 4, 5, 6, 7), (1,)),
]


@pytest.mark.parametrize(("case", "root", "group", "waiting", "partners"), SKIPS)
def test_a_skip_in_a_subgroup_names_the_rank_that_skipped_first(
        case: str, root: int, group: tuple[int, ...], waiting: tuple[int, ...], partners: tuple[int, ...]) -> None:
    """The root is the rank that skipped its subgroup's collective; the world's missing rank (its partner,
    blocked in that collective) is its consequence, not a culprit of its own."""
    dumps, left, world = recorded(case)
    assert sorted(dumps) == list(range(world))
    findings = [f for f in analyse(dumps, world, left) if f.kind != "in-step"]
    assert len(findings) == 1, findings  # one story: the world's wait is folded into the root's
    f = findings[0]
    assert (f.kind, f.culprits, f.op, f.seq) == ("missed", (root,), "all_reduce", 4)
    assert f.waiting == tuple(r for r in group if r != root)  # counted among the group's members only
    members_said = ",".join(map(str, group))
    assert f.line().startswith(f"rank {root} never entered all_reduce #4 of the group of ranks {members_said} (pg "), f.line()
    mesh = {"row": "mesh_tp", "col": "mesh_dp"}.get(case.split("-")[1])  # a DeviceMesh dimension says which
    assert f.desc == (mesh or "") and (f"(pg {f.pg}, {mesh})" in f.line() if mesh else f"(pg {f.pg});" in f.line())
    [then] = f.then
    assert (then.pg, then.culprits, then.waiting) == ("0", partners, waiting)
    assert "in the world's all_reduce #4 (pg 0)" in f.line()


def test_the_issue_s_four_rank_case_reads_as_one_chain() -> None:
    dumps, left, _ = recorded("gloo4-pairs-skip")
    [f, *_] = analyse(dumps, 4, left)
    assert f.line() == ("rank 3 never entered all_reduce #4 of the group of ranks 2,3 (pg 2); rank 2 has waited in it, "
                        "so ranks 0-1,3 wait for rank 2 in the world's all_reduce #4 (pg 0)")


def test_gloo_members_come_from_the_entries_not_from_each_ranks_own_pg_number() -> None:
    """Both pairs are pg 1 on their own ranks; their names ("1", "2") tell them apart."""
    dumps, _left, _ = recorded("gloo4-pairs-skip")
    assert all(d["pg_config"] == {"": {"name": "", "desc": "", "ranks": "[]"}} for d in dumps.values())
    assert {d["entries"][1]["pg_id"] for d in dumps.values()} == {1}
    assert members(dumps, 4) == {"0": frozenset(range(4)), "1": frozenset({0, 1}), "2": frozenset({2, 3})}
    # a 2 x 4 DeviceMesh: rows of 4, columns of 2; a group no collective ran in is in no entry, so not seen
    rows = {g for g in members(recorded("gloo8-row-skip")[0], 8).values() if g is not None}
    assert rows == {frozenset(range(8)), frozenset({0, 1, 2, 3}), frozenset({4, 5, 6, 7})}
    cols = {g for g in members(recorded("gloo8-col-skip")[0], 8).values() if g is not None}
    assert cols == {frozenset(range(8)), *(frozenset({r, r + 4}) for r in range(4))}


@pytest.mark.parametrize(("case", "kind", "root", "words"), [
    ("gloo4-pairs-gather", "mismatch-op", (3,),
     "collective mismatch at #4 of the group of ranks 2,3 (pg 2): rank 2 called all_reduce, rank 3 all_gather, "
     "so ranks 0-1 wait for ranks 2-3 in the world's all_reduce #4 (pg 0)"),
    ("gloo8-halves-gather", "mismatch-op", (5,),
     "collective mismatch at #4 of the group of ranks 4,5,6,7 (pg 2): ranks 4,6-7 called all_reduce, rank 5 "
     "all_gather, so ranks 0-3 wait for ranks 4-7 in the world's all_reduce #4 (pg 0)"),
    ("gloo8-halves-size", "mismatch-size", (5,),
     "size mismatch in all_reduce #4 of the group of ranks 4,5,6,7 (pg 2): ranks 4,6-7 passed [[4]], rank 5 "
     "passed [[8]], so ranks 0-4,6-7 wait for rank 5 in the world's all_reduce #4 (pg 0)"),
])
def test_a_mismatch_inside_a_subgroup_is_the_root(case: str, kind: str, root: tuple[int, ...], words: str) -> None:
    dumps, left, world = recorded(case)
    [f] = [f for f in analyse(dumps, world, left) if f.kind != "in-step"]
    assert (f.kind, f.culprits) == (kind, root)
    assert f.line() == words


@pytest.mark.parametrize("case", ["gloo4-pairs-finish", "gloo8-row-finish"])
def test_a_completing_job_with_subgroups_has_no_finding(case: str, tmp_path: Path) -> None:
    """Every rank exited without destroy_process_group after its last collective: each group is in step."""
    dumps, left, world = recorded(case)
    assert left == set(range(world))
    assert {f.kind for f in analyse(dumps, world, left)} == {"in-step"}
    (tmp_path / FR_DIR).mkdir()
    for f in (DATA / case).iterdir():
        (tmp_path / FR_DIR / f.name).write_bytes(f.read_bytes())
    assert post_mortem(str(tmp_path)) == []  # with no end marker at all: still no story


def test_only_the_rank_that_left_the_common_order_departs() -> None:
    dumps, _left, _ = recorded("gloo4-pairs-skip")
    assert [departs(dumps, r) for r in range(4)] == [None, None, None, 6]  # rank 3's 7th call is the world's


def test_a_full_ring_buffer_does_not_shift_the_order() -> None:
    """Ranks whose recorders dropped their oldest entries (TORCH_FR_BUFFER_SIZE reached) are compared by record id."""
    dumps, left, _ = recorded("gloo4-pairs-skip")
    dumps[0]["entries"] = dumps[0]["entries"][3:]
    dumps[3]["entries"] = dumps[3]["entries"][1:]
    assert [departs(dumps, r) for r in range(4)] == [None, None, None, 6]
    assert analyse(dumps, 4, left)[0].culprits == (3,)


def test_a_cycle_with_no_departure_keeps_both_findings() -> None:
    """Each names a rank that waits in the other's collective and no rank left the common order: nothing says
    which came first, so neither is folded into the other."""
    a = Finding("missed", "0", 4, "all_reduce", (2,), (0, 1, 3))
    b = Finding("missed", "2", 4, "all_reduce", (3,), (2,), group="ranks 2,3")
    assert chain([a, b], {}) == [a, b]


def test_why_stacks_were_not_read_is_said_in_words() -> None:
    backtrace = "Error: Failed to find python version from target process\n\nCaused by:\n    0: x\n   10: main\n"
    assert why_no_stack(backtrace) == "py-spy read no stack: Error: Failed to find python version from target process"
    assert why_no_stack("10: main\n") == "py-spy read no stack and said nothing"
    assert why_no_stack("Error: Permission denied (os error 13)").startswith("permission denied: py-spy may not attach")
    assert why_no_stack("anything", alive=False) == "the process exited while py-spy read it"
    late = "py-spy timed out after 30 s (the node is loaded)"
    stacks = [RankStack(0, "n", 10, 0.0, (), late), RankStack(1, "n", 11, 0.0, (), late)]
    assert culprit(stacks).note == f"stacks not read: {late}"
    mixed = [*stacks, RankStack(2, "n", 12, 0.0, (), "the process exited while py-spy read it")]
    assert why_unread(mixed) == f"ranks 0-1: {late}; rank 2: the process exited while py-spy read it"


def at(line: int) -> tuple[tuple[str, str, int], ...]:
    """A rank's stack waiting in all_reduce called from planted_subgroup.py ``line`` (py-spy's frame format)."""
    return (("all_reduce", "/v/site-packages/torch/distributed/distributed_c10d.py", 3252),
            ("wrapper", "/v/site-packages/torch/distributed/c10d_logger.py", 83),
            ("<module>", "/work/planted_subgroup.py", line))


def test_the_hang_watch_names_the_root_with_the_stacks_as_corroboration(tmp_path: Path) -> None:
    """The stacks showed it too: rank 2 at the pair's all_reduce (line 66), every other rank at the world's
    (line 69). The watch's first line names rank 3, and the verdict's culprit is rank 3, not rank 2."""
    import os
    import time

    from torchhpc.diagnose.evidence import Evidence
    from torchhpc.diagnose.hang_verdict import with_flight
    from torchhpc.diagnose.verdict import diagnose

    fr = tmp_path / FR_DIR
    fr.mkdir()
    for f in (DATA / "gloo4-pairs-skip").iterdir():
        (fr / f.name).write_bytes(f.read_bytes())
        os.utime(fr / f.name, (time.time() + 60, time.time() + 60))  # as if written on the watch's request
    stacks = [RankStack(r, "n1", 100 + r, 0.0, at(66 if r == 2 else 69)) for r in range(4)]
    v = with_flight(culprit(stacks), str(tmp_path), wait=0.5)
    assert v.flight_culprits == (3,) and v.flight_kind == "missed"
    assert v.flight[0].startswith("rank 3 never entered all_reduce #4 of the group of ranks 2,3 (pg 2)")
    assert v.flight[0].endswith("; rank 3's stack: all_reduce at /work/planted_subgroup.py:69; "
                                "rank 2's stack: all_reduce at /work/planted_subgroup.py:66"), v.flight[0]
    assert len(v.flight) == 1  # the pair {0,1} in step is no story of its own
    verdict = diagnose(Evidence(hang={"quiet_s": 20.0, **v.to_json()}, job="local:x"))
    assert verdict.first is not None and verdict.first.rank == 3 and verdict.consequences == (0, 1, 2)
