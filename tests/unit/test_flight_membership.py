"""Flight Recorder findings take each process group's membership from the dumps (issue 51, items 1-2).

The dumps are built in the format torch 2.13 writes (the keys and values of the recorded dumps in
tests/data/flight_recorder; make_dumps.py there says how they were taken), for 2, 4 and 8 ranks and
each collective, with the sizes each backend records: an all_gather's output is the group's size times
its input (gloo records a list output as ``[[world, n]]``, NCCL's ``_all_gather_base`` as
``[[world * n]]``), a reduce_scatter's input is the group's size times its output. With a group of
the wrong size (the old ``{pg: {0, 1}}``), torch's matcher calls every all_gather a size mismatch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from torchhpc.diagnose.flight import FR_DIR, analyse, members, post_mortem

N = 4  # elements per rank


def sizes(op: str, world: int) -> tuple[list[list[int]], list[list[int]]]:
    """(input_sizes, output_sizes) as the recorder writes them for one rank's call."""
    return {
        "all_reduce": ([[N]], [[N]]),
        "all_gather": ([[N]], [[world, N]]),
        "_all_gather_base": ([[N]], [[world * N]]),
        "reduce_scatter": ([[world, N]], [[N]]),
        "_reduce_scatter_base": ([[world * N]], [[N]]),
        "broadcast": ([[N]], [[N]]),
        "barrier": ([], []),
        "all_reduce_barrier": ([[1]], [[1]]),
        "all_to_all": ([[world * N]], [[world * N]]),
    }[op]


def entry(backend: str, pg: int, seq: int, op: str, world: int, state: str, size: int = 0) -> dict[str, Any]:
    inp, out = sizes(op, world)
    if size:
        inp = [[size]]
    return {"frames": [], "record_id": seq - 1, "pg_id": pg, "process_group": (str(pg), "default_pg" if pg == 0 else "undefined"),
            "thread_name": "python", "thread_id": "140465024396160", "collective_seq_id": seq, "p2p_seq_id": 0,
            "op_id": seq, "profiling_name": f"{backend}:{op}", "time_created_ns": 1795664972021501884 + seq,
            "input_sizes": inp, "input_dtypes": ["Float"] * len(inp), "output_sizes": out,
            "output_dtypes": ["Float"] * len(out), "state": state, "time_discovered_started_ns": None,
            "time_discovered_completed_ns": None, "retired": state == "completed", "timeout_ms": 600000, "is_p2p": False}


def dump(backend: str, world: int, calls: list[dict[str, Any]], groups: dict[str, list[int]]) -> dict[str, Any]:
    status: dict[str, dict[str, int]] = {}
    for e in calls:
        st = status.setdefault(str(e["pg_id"]), {"last_enqueued_collective": -1, "last_started_collective": -1,
                                                  "last_completed_collective": -1})
        st["last_enqueued_collective"] = e["collective_seq_id"]
        if e["state"] == "completed":
            st["last_completed_collective"] = e["collective_seq_id"]
    if backend == "gloo":  # torch 2.13's gloo names no group in pg_config: the default group under ""
        conf = {"": {"name": "", "desc": "", "ranks": str(list(range(world)))}}
    else:
        conf = {k: {"name": k, "desc": "default_pg" if k == "0" else "undefined", "ranks": str(v)} for k, v in groups.items()}
    return {"version": "2.10", "pg_config": conf, "comm_lib_version": "2.27.5" if backend == "nccl" else "",
            "pg_status": status, "entries": calls}


CASES = [("nccl", "all_reduce"), ("nccl", "all_gather"), ("nccl", "_all_gather_base"), ("nccl", "reduce_scatter"),
         ("nccl", "_reduce_scatter_base"), ("nccl", "broadcast"), ("nccl", "all_reduce_barrier"), ("nccl", "all_to_all"),
         ("gloo", "all_reduce"), ("gloo", "all_gather"), ("gloo", "broadcast"), ("gloo", "barrier"), ("gloo", "all_to_all")]


def planted(backend: str, op: str, world: int, skip: int = 1, top: int = 12, bad_size: int = 0
            ) -> dict[int, dict[str, Any]]:
    """Every rank ran ``top - 1`` calls of ``op``; all but ``skip`` wait in #top (``bad_size``: ``skip``
    enters it too, with another input size)."""
    out = {}
    for r in range(world):
        calls = [entry(backend, 0, s, op, world, "completed") for s in range(1, top)]
        if r != skip or bad_size:
            calls.append(entry(backend, 0, top, op, world, "started" if backend == "nccl" else "scheduled",
                               bad_size if r == skip else 0))
        out[r] = dump(backend, world, calls, {"0": list(range(world))})
    return out


@pytest.mark.parametrize("world", [2, 4, 8])
@pytest.mark.parametrize(("backend", "op"), CASES)
def test_a_rank_that_never_entered_the_collective_is_named_by_its_number(backend: str, op: str, world: int) -> None:
    findings = analyse(planted(backend, op, world), world, now=None)
    assert [(f.kind, f.seq, f.culprits) for f in findings] == [("missed", 12, (1,))], findings
    others = "rank 0" if world == 2 else f"ranks 0,2-{world - 1}" if world > 3 else "ranks 0,2"
    have = "has" if world == 2 else "have"
    assert findings[0].line() == f"rank 1 never entered {op} #12 (pg 0); {others} {have} waited in it"


@pytest.mark.parametrize("world", [2, 4, 8])
@pytest.mark.parametrize(("backend", "op"), CASES)
def test_ranks_in_step_are_no_finding(backend: str, op: str, world: int) -> None:
    """Every rank completed #437 alike: nothing to report (it was a "size mismatch" of all_gather, with ranks
    listed on neither side)."""
    dumps = {r: dump(backend, world, [entry(backend, 0, s, op, world, "completed") for s in range(430, 438)],
                     {"0": list(range(world))}) for r in range(world)}
    assert [f.kind for f in analyse(dumps, world)] == ["in-step"]


@pytest.mark.parametrize("world", [2, 4, 8])
@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "_all_gather_base", "reduce_scatter", "broadcast"])
def test_a_real_size_mismatch_is_still_named(op: str, world: int) -> None:
    findings = analyse(planted("nccl", op, world, bad_size=3 * N), world)
    assert [(f.kind, f.culprits) for f in findings] == [("mismatch-size", (1,))], findings
    assert "rank 1 passed [[12]]" in findings[0].line()


def test_a_subgroup_takes_its_members_from_pg_config() -> None:
    """8 ranks; pg 1 holds the even ranks; rank 4 never enters its all_gather #3, ranks 0, 2 and 6 wait."""
    world, group = 8, [0, 2, 4, 6]
    dumps = {}
    for r in range(world):
        calls = [entry("nccl", 0, s, "all_reduce", world, "completed") for s in (1, 2)]
        if r in group:
            calls += [entry("nccl", 1, s, "all_gather", len(group), "completed") for s in (1, 2)]
            if r != 4:
                calls.append(entry("nccl", 1, 3, "all_gather", len(group), "started"))
        dumps[r] = dump("nccl", world, calls, {"0": list(range(world)), "1": group})
    assert members(dumps, world)["1"] == frozenset(group)
    findings = [f for f in analyse(dumps, world) if f.kind != "in-step"]
    assert [f.line() for f in findings] == [
        "rank 4 never entered all_gather #3 of the group of ranks 0,2,4,6 (pg 1); ranks 0,2,6 have waited in it"]


def test_gloo_groups_without_names_take_their_members_from_the_entries() -> None:
    """gloo's pg_config names no group: pg 0 is the world, another group's members are the ranks whose
    entries name it (issue 65: rank 3 is no member of the pair {0,1}, so it never waits there)."""
    dumps = planted("gloo", "all_gather", 4)
    assert members(dumps, 4) == {"0": frozenset(range(4))}
    for r, d in dumps.items():
        if r < 2:
            d["entries"].append(entry("gloo", 1, 1, "all_gather", 2, "completed"))
            d["pg_status"]["1"] = {"last_enqueued_collective": 1, "last_started_collective": -1,
                                   "last_completed_collective": 1}
    assert members(dumps, 4)["1"] == frozenset({0, 1})
    assert [f.kind for f in analyse(dumps, 4)] == ["missed", "in-step"]


def test_a_completed_job_reports_no_finding(tmp_path: Path) -> None:
    """Ranks that exit without destroy_process_group leave dumps: a job that completed has no culprit."""
    (tmp_path / FR_DIR).mkdir()
    import pickle

    for r, d in planted("gloo", "all_gather", 4).items():
        (tmp_path / FR_DIR / f"rank-{r}.left").write_bytes(pickle.dumps(d))
    assert [f.kind for f in post_mortem(str(tmp_path))] == ["left"]
    (tmp_path / "end.json").write_text(json.dumps({"state": "COMPLETED", "exit_code": 0, "time": 1.0}))
    assert post_mortem(str(tmp_path)) == []


def test_no_line_has_an_empty_rank_list() -> None:
    """When no two ranks' calls agree there is no majority to name: no finding lists nobody."""
    world = 4
    dumps = {r: dump("nccl", world, [entry("nccl", 0, 1, "all_reduce", world, "started", size=r + 1)],
                     {"0": list(range(world))}) for r in range(world)}
    for f in analyse(dumps, world):
        assert "rank  " not in f.line() and not f.line().startswith("rank ,") and "ranks  " not in f.line()
        assert f.culprits or f.kind in ("stalled", "in-step")
