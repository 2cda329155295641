"""Many jobs in one question: Slurm's squeue (then sacct for the forgotten) and PBS's qstat, on output
recorded from the dev cluster (tests/data/slurm/*_many.txt: ids 1,2,3,9,10,11,12 asked together:
job 1 had left the controller, 2 and 9 are arrays, 11 was killed by SIGKILL)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fakes import FakeRunner
from torchhpc.schedulers.slurm.many import parse_squeue, query_many

DATA = Path(__file__).parent.parent / "data" / "slurm"
SQUEUE = (DATA / "squeue_many.txt").read_text()
SACCT = (DATA / "sacct_many.txt").read_text()


def _sacct_rows(argv: list[str], _input: object) -> str:
    wanted = set(argv[argv.index("-j") + 1].split(","))
    return "".join(line + "\n" for line in SACCT.splitlines() if line.split("|")[0].split("_")[0] in wanted)


def test_one_squeue_and_one_sacct_for_the_forgotten() -> None:
    runner = FakeRunner(responses={"squeue": SQUEUE, "sacct": _sacct_rows})
    got = query_many(runner, ["1", "2", "3", "9", "10", "11", "12", "404"])
    assert [c[0][0] for c in runner.calls] == ["squeue", "sacct"]
    assert runner.calls[1][0][runner.calls[1][0].index("-j") + 1] == "1,404"  # only what squeue no longer shows
    assert (got["1"].state, got["1"].exit_code) == ("COMPLETED", 0)
    assert got["2"].state == "COMPLETED" and len(got["2"].tasks) == 6
    assert (got["3"].state, got["3"].exit_code) == ("FAILED", 3)
    assert got["9"].state == "RUNNING" and len(got["9"].tasks) == 20 and got["9"].exit_code is None
    assert got["10"].state == "RUNNING" and got["10"].exit_code is None
    assert (got["11"].state, got["11"].exit_code) == ("FAILED", 137)  # SIGKILL, as scontrol's 0:9 reads
    assert got["12"].nodes == "node[2-3]"
    assert "404" not in got


def test_all_known_to_the_controller_is_one_call() -> None:
    runner = FakeRunner(responses={"squeue": SQUEUE, "sacct": _sacct_rows})
    got = query_many(runner, ["9", "2", "3"])
    assert len(runner.calls) == 1 and set(got) == {"9", "2", "3"}


def test_none_known_to_the_controller_goes_to_sacct() -> None:
    runner = FakeRunner(responses={"squeue": (1, "", "slurm_load_jobs error: Invalid job id specified\n"),
                                   "sacct": _sacct_rows})
    got = query_many(runner, ["1", "3"])
    assert set(got) == {"1", "3"} and got["3"].exit_code == 3


@pytest.mark.parametrize("state", ["PENDING", "RUNNING", "COMPLETING", "REQUEUE_HOLD"])
def test_many_and_one_say_the_same_exit_code_in_every_state(state: str) -> None:
    """``status A B`` (squeue) and ``status A`` (scontrol) for the same job: no code before it ended,
    the batch shell's code once it has (COMPLETING: the shell exited, the nodes are still cleaning up)."""
    from torchhpc.schedulers.slurm.parse import status_from_scontrol

    one = status_from_scontrol("5", {"JobState": state, "ExitCode": "3:0"})
    many = parse_squeue(f"5|{state}|768|0:01|node1|None|j|\n")["5"]
    assert many.exit_code == one.exit_code == (None if state in ("PENDING", "RUNNING") else 3)


def test_a_name_holding_the_separator() -> None:
    rows = parse_squeue("5|COMPLETED|0|0:01|node1|None|a|b|\n")
    assert rows["5"].name == "a|b"


def test_pbs_asks_qstat_once_for_all() -> None:
    import json

    from torchhpc.schedulers.pbs.pbs import PBSScheduler

    data = json.loads((Path(__file__).parent.parent / "data" / "pbs" / "qstat_json_history.json").read_text())
    ids = list(data["Jobs"])
    runner = FakeRunner(responses={"qstat": json.dumps(data)})
    got = PBSScheduler(runner=runner).query_many([*ids, "999.nowhere"])
    assert len(runner.calls) == 1 and set(got) == set(ids)
