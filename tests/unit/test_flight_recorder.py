"""Flight Recorder dumps of a planted hang: the rank whose collective sequence is behind is named.

The dumps in tests/data/flight_recorder are built in torch 2.13's dump format (make_dumps.py says how,
from a real gloo dump taken here): no NCCL runs where torchhpc is developed.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest

from torchhpc.diagnose.flight import behind, load_dumps, read_dump

DATA = Path(__file__).parent.parent / "data" / "flight_recorder"


def test_the_planted_hang_is_classified_from_the_dumps() -> None:
    dumps = load_dumps(str(DATA), prefix="nccl_trace_rank_")
    assert sorted(dumps) == [0, 1, 2, 3]
    [v] = behind(dumps)
    assert v.behind == (3,) and v.seq[3] == 1 and v.waiting_in == "nccl:all_reduce"
    assert v.lines() == ["flight recorder: rank(s) 3 of process group 0 are behind: rank 3 at collective 1; "
                         "the others reached 2 (nccl:all_reduce)"]


def test_a_dump_that_would_run_code_is_refused(tmp_path: Path) -> None:
    class Boom:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, ("touch pwned",))

    with pytest.raises(pickle.UnpicklingError):
        read_dump(pickle.dumps({"entries": [Boom()]}))
    (tmp_path / "nccl_trace_rank_0").write_bytes(pickle.dumps({"x": Boom()}))
    assert load_dumps(str(tmp_path), prefix="nccl_trace_rank_") == {}
    assert not (tmp_path / "pwned").exists() and not Path("pwned").exists()
