"""Verdict lines say only what was observed (issue 51, items 5-6; style lesson 17).

The hang records are hang.json as the watch writes it (diagnose/hang.py ``save``): its stacks, culprits,
note and Flight Recorder lines; the cancelled jobs' evidence is what ``gather`` reads of a local job.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from torchhpc.diagnose.evidence import Evidence
from torchhpc.diagnose.hang import HangWatch
from torchhpc.diagnose.hang_verdict import culprit, render
from torchhpc.diagnose.probe import RankStack
from torchhpc.diagnose.verdict import diagnose
from torchhpc.jobdir.logs import Line

NO_PY_SPY = "py-spy is not installed here (pip install py-spy)"
SLEEP = (("sleep_a_while", "/home/u/train.py", 12), ("<module>", "/home/u/train.py", 30))


def _hang_json(stacks: list[RankStack], flight: tuple[str, ...] = (), named: tuple[int, ...] = ()) -> dict[str, Any]:
    v = culprit(stacks)
    d: dict[str, Any] = {"quiet_s": 31.0, **asdict(v), "flight": list(flight), "flight_culprits": list(named),
                         "flight_kind": "missed" if named else ""}
    d["stacks"] = [{**asdict(s), "frames": [list(f) for f in s.frames]} for s in stacks]
    return d


def test_without_py_spy_no_rank_is_said_to_be_outside_a_collective() -> None:
    """The Flight Recorder says rank 0 never entered barrier #7: nothing may say rank 0 "is not in a collective",
    and nothing may say "see the stacks above" when none was read."""
    stacks = [RankStack(r, "localhost", 100 + r, 0.0, (), NO_PY_SPY) for r in range(4)]
    flight = ("rank 0 never entered barrier #7 (pg 0); ranks 1-3 have waited in it for 30 s",)
    v = culprit(stacks)
    assert v.culprits == () and v.note == f"stacks not read: {NO_PY_SPY}"
    assert not any("is not in a collective" in line for line in render(v, 31.0))
    out = diagnose(Evidence(hang=_hang_json(stacks, flight, (0,)), job="local:x")).render()
    assert out.startswith("diagnosis: hang — rank 0 never entered barrier #7"), out
    assert "not in a collective" not in out and "see the stacks above" not in out, out
    assert f"stacks not read ({NO_PY_SPY})" in out and "culprit: rank 0" in out, out


def test_without_py_spy_or_a_dump_no_culprit_is_named() -> None:
    stacks = [RankStack(r, "localhost", 100 + r, 0.0, (), NO_PY_SPY) for r in range(2)]
    out = diagnose(Evidence(hang=_hang_json(stacks), job="local:x")).render()
    assert "culprit:" not in out and "see the stacks above" not in out, out
    assert "stacks not read" in out and "`torchhpc logs local:x`" in out, out


def test_ranks_that_sleep_alike_name_no_culprit() -> None:
    """Every rank quiet in its own code, none in a collective: "culprit: rank 0" would be a guess."""
    stacks = [RankStack(r, "localhost", 100 + r, 0.0, SLEEP) for r in range(4)]
    v = culprit(stacks)
    assert v.culprits == () and v.waiting == () and "none stands out" in v.note
    out = diagnose(Evidence(hang=_hang_json(stacks), job="local:x")).render()
    # issue 64: a program with no rank inside torch is not told about DDP's collectives from C++
    assert "culprit:" not in out and "no rank is inside torch" in out and "DDP" not in out, out
    in_torch = [RankStack(r, "localhost", 100 + r, 0.0, (("backward", "/venv/torch/autograd/__init__.py", 9), *SLEEP))
                for r in range(4)]
    assert "no Python stack is in a torch.distributed call" in culprit(in_torch).note


def test_a_flight_recorder_culprit_replaces_the_stacks_guess(tmp_path: Any) -> None:
    """Lightning: rank 0 waits in DDP's all_reduce from C++ (its Python stack is in backward), rank 1 sleeps.
    The stacks alone name no one; the dumps name rank 1, and no line then says "no rank waits"."""
    import pickle

    from torchhpc.diagnose import flight
    from torchhpc.diagnose.hang_verdict import with_flight

    backward = (("_engine_run_backward", "torch/autograd/graph.py", 979), ("training_step", "/home/u/t.py", 40))
    stacks = [RankStack(0, "localhost", 100, 0.0, backward), RankStack(1, "localhost", 101, 0.0, SLEEP)]
    v = culprit(stacks)
    entry = {"pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": 52, "profiling_name": "gloo:all_reduce",
             "input_sizes": [[4]], "output_sizes": [[4]], "input_dtypes": ["Float"], "output_dtypes": ["Float"],
             "state": "scheduled", "retired": False, "is_p2p": False, "time_created_ns": 1}
    d = tmp_path / flight.FR_DIR
    d.mkdir()
    for rank, last in ((0, 52), (1, 51)):
        dump = {"version": "2.10", "pg_config": {"": {"name": "", "desc": "", "ranks": "[0, 1]"}},
                "pg_status": {"0": {"last_enqueued_collective": last}},
                "entries": [{**entry, "collective_seq_id": last, "retired": last == 51}]}
        (d / f"rank-{rank}").write_bytes(pickle.dumps(dump))
    monkey = flight.collect
    flight.collect = lambda job_dir, ranks, since, wait: (flight.load_dumps(str(d), "rank-"), set())  # type: ignore[assignment,misc]
    try:
        named = with_flight(v, str(tmp_path))
    finally:
        flight.collect = monkey  # type: ignore[assignment]
    assert named.flight_culprits == (1,) and named.note == "", named
    lines = render(named, 16.0)
    assert lines[1].startswith("torchhpc: hang: rank 1 never entered all_reduce #52 (pg 0)"), lines
    assert not any("none stands out" in ln or "no Python stack" in ln for ln in lines), lines


def test_the_watch_says_what_it_does() -> None:
    said: list[str] = []
    w = HangWatch({}, 1.0, "cancel", "", "", lambda: None, lambda _w: None, said.append,
                  acting="stop this attempt (--max-restarts 2: the supervisor decides whether it restarts)")
    assert w.acting.startswith("stop this attempt")


def test_the_restart_loop_tells_its_watch_it_stops_an_attempt(tmp_path: Any) -> None:
    from torchhpc.supervisor.restarts import Restarts

    made: list[Any] = []

    class Watch:
        acting = ""

        def check(self, _state: str) -> None:
            return None

    def factory(_act: Any) -> Watch:
        made.append(Watch())
        return made[-1]

    Restarts(max_restarts=3, job_dir=str(tmp_path), log_path=str(tmp_path / "x.log"), watch=factory).run(lambda n: n)
    assert made[0].acting == "stop this attempt (--max-restarts 3: the supervisor decides whether it restarts)"


def test_a_ctrl_c_is_not_someone_running_scancel() -> None:
    ev = Evidence(lines=[Line(0, "up"), Line(1, "up"), Line(None, "interrupted by SIGINT; stopped 2 running rank(s) of 2")],
                  state="CANCELLED", exit_code=130, job="local:x", local=True, nproc_per_node=2,
                  reason="interrupted by SIGINT; stopped 2 running rank(s) of 2")
    v = diagnose(ev)
    out = v.render()
    assert v.klass == "cancelled" and "Ctrl-C (SIGINT)" in v.summary, out
    assert "scancel" not in out and "by a user" not in out and "failed as a consequence" not in out, out


def test_a_job_that_never_started_points_at_no_log() -> None:
    ev = Evidence(state="CANCELLED", job="local:x", local=True, nproc_per_node=1, reason="DependencyNeverSatisfied")
    v = diagnose(ev)
    out = v.render()
    assert v.summary.startswith("the job never started") and v.consequences == (), out
    assert "torchhpc logs" not in out and "scancel" not in out and "rank" not in out, out


def test_slurm_names_the_uid_that_cancelled() -> None:
    v = diagnose(Evidence(state="CANCELLED by 1000", job="slurm:7"))
    assert v.klass == "cancelled" and v.summary == "the job was cancelled by uid 1000" and "scancel" not in v.render()
