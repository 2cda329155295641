"""Flight Recorder dumps of a planted hang: the rank whose collective sequence is behind is named.

The dumps in tests/data/flight_recorder are built in torch 2.13's dump format (make_dumps.py says how,
from a real gloo dump taken here): no NCCL runs where torchhpc is developed.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest

from torchhpc.diagnose.flight import (
    FR_DIR,
    analyse,
    collect,
    load_dumps,
    post_mortem,
    read_dump,
    request,
)

DATA = Path(__file__).parent.parent / "data" / "flight_recorder"


def test_the_planted_hang_is_classified_from_the_dumps() -> None:
    dumps = load_dumps(str(DATA), prefix="nccl_trace_rank_")
    assert sorted(dumps) == [0, 1, 2, 3]
    [f] = analyse(dumps, 4)
    assert (f.kind, f.pg, f.seq, f.op, f.culprits, f.waiting) == ("missed", "0", 2, "all_reduce", (3,), (0, 1, 2))


def test_a_dump_that_would_run_code_is_refused(tmp_path: Path) -> None:
    class Boom:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, ("touch pwned",))

    with pytest.raises(pickle.UnpicklingError):
        read_dump(pickle.dumps({"entries": [Boom()]}))
    (tmp_path / "nccl_trace_rank_0").write_bytes(pickle.dumps({"x": Boom()}))
    assert load_dumps(str(tmp_path), prefix="nccl_trace_rank_") == {}
    assert not (tmp_path / "pwned").exists() and not Path("pwned").exists()


# Real gloo dumps of the five planted programs (tests/data/flight_recorder/README.md), rank 1 the culprit.
@pytest.mark.parametrize(
    ("case", "kind", "seq", "words"),
    [
        ("skip", "missed", 5, "rank 1 never entered all_reduce #5 (pg 0); ranks 0,2-3 have waited in it"),
        ("sleep", "missed", 4, "rank 1 never entered all_reduce #4 (pg 0)"),
        ("gather", "mismatch-op", 4, "collective mismatch at #4 (pg 0): ranks 0,2-3 called all_reduce, rank 1 all_gather"),
        ("size", "mismatch-size", 4, "size mismatch in all_reduce #4 (pg 0): ranks 0,2-3 passed [[4]], rank 1 passed [[8]]"),
        ("first", "missed", 1, "rank 3 never entered all_reduce #1 (pg 0); ranks 0-2 have waited in it"),
        ("exit", "left", 4, "rank 1 left the group (exited without destroy_process_group) before all_reduce #4"),
    ],
)
def test_each_planted_case_is_named_from_real_gloo_dumps(case: str, kind: str, seq: int, words: str) -> None:
    d = DATA / f"gloo-{case}"
    left = set(load_dumps(str(d), "rank-", ".left"))
    dumps = {**load_dumps(str(d), "rank-"), **load_dumps(str(d), "rank-", ".left")}
    assert sorted(dumps) == [0, 1, 2, 3]
    first = analyse(dumps, 4, left, now=None)[0]
    assert (first.kind, first.seq, first.culprits) == (kind, seq, (3,) if case == "first" else (1,))
    assert first.line().startswith(words), first.line()


def test_a_rank_without_a_dump_is_named(tmp_path: Path) -> None:
    for r in (0, 2, 3):
        (tmp_path / f"rank-{r}").write_bytes((DATA / "gloo-sleep" / f"rank-{r}").read_bytes())
    findings = analyse(load_dumps(str(tmp_path), "rank-"), 4)
    assert [f.kind for f in findings] == ["no-dump"] and findings[0].culprits == (1,)
    assert "rank 1 wrote no flight recorder dump" in findings[0].line()


def test_the_dumps_of_a_finished_job_are_read_from_its_directory(tmp_path: Path) -> None:
    (tmp_path / FR_DIR).mkdir()
    for f in (DATA / "gloo-exit").iterdir():
        (tmp_path / FR_DIR / f.name).write_bytes(f.read_bytes())
    [f] = post_mortem(str(tmp_path))
    assert (f.kind, f.culprits, f.waiting) == ("left", (1,), (0, 2, 3))


def test_the_hang_watch_asks_every_rank_and_waits_for_their_dumps(tmp_path: Path) -> None:
    """The request file is what a rank's dump thread watches; collect waits for fresh files only."""
    import threading
    import time

    d = tmp_path / FR_DIR
    d.mkdir()
    (d / "rank-0").write_bytes(b"stale")  # from before the request: never read as an answer
    since = request(str(tmp_path)) - 0.5
    assert (d / "request").exists()

    def answer() -> None:
        time.sleep(0.3)
        for r in (0, 1):
            (d / f"rank-{r}").write_bytes((DATA / "gloo-sleep" / f"rank-{r}").read_bytes())

    threading.Thread(target=answer).start()
    dumps, left = collect(str(tmp_path), 2, since + 0.4, wait=5.0)
    assert sorted(dumps) == [0, 1] and left == set()
