"""``torchhpc events``: the scheduler's clock (recorded sacct and qstat -f formats), attempts.json
laid over it, the account that partitions the wall time, the JSON object and the plot's data.

The schedulers are answered by core.proc's FakeRunner (no Slurm accounting or PBS server in a unit
test): tests/data/slurm/sacct_times.txt is ``sacct -X -n -P -o TIMES_FIELDS`` in the dev cluster's
format (written by hand for jobs 57 and 58); the PBS files are tests/data/pbs's. The attempts.json is
synthetic: a node-loss job on node[1-3] with one spare, in the supervisor's contract.
"""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import need
from tests.fakes import FakeRunner
from torchhpc.diagnose.account import account
from torchhpc.diagnose.events import gather, timeline
from torchhpc.diagnose.events_plot import plot_data
from torchhpc.jobdir.record import new_record, save_record
from torchhpc.schedulers.pbs.pbs import PBSScheduler
from torchhpc.schedulers.slurm.slurm import SlurmScheduler
from torchhpc.schedulers.times import JobTimes, clock

DATA = Path(__file__).parent.parent / "data"
SACCT = (DATA / "slurm" / "sacct_times.txt").read_text()
T = clock("2026-11-27T02:44:01")
assert T is not None
SUBMIT, START, END = T, T + 8, T + 131  # sacct's Submit, Start, End of job 57

# attempt 0 on node1,node2 loses node2 (probe, 3 s after its last sign of life), the spare node3 takes over
ATTEMPTS = [
    {"attempt": 0, "nodes": ["node1", "node2"], "launched": START + 2, "started": START + 2, "first_line": START + 9,
     "fault": START + 50, "ended": START + 52.5, "teardown_s": 2.5, "class": "node-failure", "found_by": "probe",
     "excluded": ["node2"], "exit_code": None, "checkpoint_step": 100, "checkpoint_time": START + 40},
    {"attempt": 1, "nodes": ["node1", "node3"], "started": START + 53, "launched": START + 54.5, "health_s": 1.5,
     "health": {}, "first_line": START + 60, "ended": START + 120, "class": None, "found_by": "",
     "checkpoint_step": 300},
]


def _sacct(argv: list[str], _input: object) -> str:
    wanted = argv[argv.index("-j") + 1]
    return "".join(line + "\n" for line in SACCT.splitlines() if line.split("|")[0] == wanted)


def test_slurm_times_are_one_sacct_call_and_no_controller_call() -> None:
    runner = FakeRunner(responses={"sacct": _sacct})
    got = SlurmScheduler(runner=runner).times("57")
    assert [c[0][0] for c in runner.calls] == ["sacct"]
    assert (got.submit, got.eligible, got.start, got.end) == (SUBMIT, SUBMIT, START, END)
    assert (got.state, got.exit_code, got.nodes, got.source) == ("COMPLETED", 0, "node[1-3]", "sacct")


def test_a_pending_slurm_job_has_no_start_and_keeps_its_reason() -> None:
    got = SlurmScheduler(runner=FakeRunner(responses={"sacct": _sacct})).times("58")
    assert got.start is None and got.end is None and got.state == "PENDING"
    assert got.reasons == ((clock("2026-11-27T02:47:30"), "Resources"),)


def test_without_accounting_the_scontrol_record_answers() -> None:
    scontrol = ("JobId=59 JobName=x JobState=RUNNING Reason=None ExitCode=0:0 SubmitTime=2026-11-27T03:00:00 "
                "EligibleTime=2026-11-27T03:00:00 StartTime=2026-11-27T03:00:05 EndTime=2026-11-27T04:00:05 "
                "NodeList=node[1-2]\n")
    runner = FakeRunner(responses={"sacct": (1, "", "Slurm accounting storage is disabled\n"), "scontrol": scontrol})
    got = SlurmScheduler(runner=runner).times("59")
    assert [c[0][0] for c in runner.calls] == ["sacct", "scontrol"]
    assert got.start == clock("2026-11-27T03:00:05") and got.end is None and got.source == "scontrol"


def test_pbs_times_from_torque_qstat_full() -> None:
    text = (DATA / "pbs" / "qstat_full_torque.txt").read_text()
    runner = FakeRunner(responses={"qstat": lambda argv, _i: (1, "", "qstat: invalid option -- 'x'\n")
                                   if "-x" in argv else (0, text, "")})
    got = PBSScheduler(runner=runner).times("912.torque-head.cluster")
    assert got.submit == clock("Sat Nov 22 03:40:00 2026") and got.start == clock("Sat Nov 22 03:40:01 2026")
    assert got.end == clock("Sat Nov 22 03:41:10 2026") and got.state == "COMPLETED" and got.source == "qstat"


def test_pbs_pro_json_ends_at_obittime_and_a_queued_job_keeps_its_comment() -> None:
    text = (DATA / "pbs" / "qstat_json_history.json").read_text()
    got = PBSScheduler(runner=FakeRunner(responses={"qstat": text})).times("4711.pbsserver01")
    assert got.end == clock("Sat Nov 22 04:01:00 2026") and got.state == "COMPLETED"
    pending = (DATA / "pbs" / "qstat_full_pro.txt").read_text()
    runner = FakeRunner(responses={"qstat": lambda argv, _i: (1, "", "qstat: illegal -F\n") if "-F" in argv
                                   else (0, pending, "")})
    queued = PBSScheduler(runner=runner).times("4720.pbsserver01")
    assert queued.start is None and queued.end is None
    assert queued.submit == clock("Sat Nov 22 04:10:02 2026")
    assert queued.reasons and queued.reasons[0][1].startswith("Not Running: Insufficient amount of resource")


def test_the_account_partitions_the_wall_time() -> None:
    a = account(SUBMIT, START, END, ATTEMPTS)
    parts = a.queue_s + a.startup_s + a.productive_s + a.lost_s + a.shutdown_s
    assert abs(parts - a.wall_s) <= 1.0 and a.wall_s == END - SUBMIT
    assert (a.queue_s, a.startup_s, a.shutdown_s) == (8.0, 9.0, 3.0)
    (inc,) = a.incidents
    assert (inc.klass, inc.found_by, inc.teardown_s, inc.health_s) == ("node-failure", "probe", 2.5, 1.5)
    assert inc.restart_s == pytest.approx(0.5 + 1.5 - 1.5 + 5.5)  # ended -> launched less the gate, + the launch
    assert inc.recompute_s == 10.0 and inc.recompute_known  # the checkpoint 10 s before the fault
    assert a.productive_s == (50 - 9 - 10) + (120 - 60)
    assert a.line() == "ETTR 69.5 % over 2 min, 1 incident, 20 s lost, 10 of them recompute"


def test_a_hang_before_any_checkpoint_loses_the_whole_attempt() -> None:
    rows: list[dict[str, Any]] = [{"attempt": 0, "started": 10.0, "first_line": 12.0, "ended": 40.0, "class": "hang", "checkpoint_step": None},
            {"attempt": 1, "started": 41.0, "first_line": 43.0, "ended": 80.0, "class": None}]
    a = account(0.0, 5.0, 81.0, rows, hang_quiet_s=6.0)
    (inc,) = a.incidents
    assert (inc.detection_s, inc.recompute_s, inc.restart_s) == (6.0, 22.0, 3.0)
    assert a.productive_s == 37.0 and abs(a.queue_s + a.startup_s + a.productive_s + a.lost_s + a.shutdown_s - 81) < 1e-9


def test_old_records_and_clocks_out_of_order_still_sum() -> None:
    rows: list[dict[str, Any]] = [{"attempt": 1, "started": 90.0}, {"attempt": 0, "started": 30.0, "ended": 200.0, "class": "network"}]
    a = account(0.0, 50.0, 100.0, rows)  # the supervisor's clock runs past the scheduler's End
    assert abs(a.queue_s + a.startup_s + a.productive_s + a.lost_s + a.shutdown_s - a.wall_s) <= 1.0


def _slurm_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[FakeRunner, SlurmScheduler]:
    monkeypatch.setenv("TORCHHPC_STATE_DIR", str(tmp_path / "state"))
    job_dir = tmp_path / "nodeloss-57"
    job_dir.mkdir()
    (job_dir / "attempts.json").write_text(json.dumps(ATTEMPTS))
    (job_dir / "end.json").write_text(json.dumps({"state": "COMPLETED", "exit_code": 0, "time": END}))
    save_record(new_record("slurm", "57", job_dir=str(job_dir)))
    runner = FakeRunner(responses={"sacct": _sacct})
    return runner, SlurmScheduler(runner=runner)


def test_events_json_of_a_finished_slurm_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runner, sched = _slurm_job(tmp_path, monkeypatch)
    tl = gather(sched, "slurm", "57")
    assert len(runner.calls) == 1 and runner.calls[0][0][0] == "sacct"  # one accounting call, nothing else
    out = json.loads(json.dumps(tl.to_json()))
    kinds = [e["kind"] for e in out["events"]]
    for k in ("submit", "eligible", "start", "attempt", "first-line", "fault", "teardown", "exclude", "restart", "end"):
        assert k in kinds, kinds
    assert kinds[0] == "submit" and kinds[-1] == "end" and kinds.count("attempt") == 2
    times = [e["time"] for e in out["events"]]
    assert times == sorted(times)
    at = {e["kind"]: e["time"] for e in out["events"]}
    assert (at["submit"], at["start"], at["end"]) == (SUBMIT, START, END)  # sacct's own seconds
    acct = out["account"]
    assert set(acct) >= {"wall_s", "queue_s", "startup_s", "productive_s", "lost_s", "incidents", "ettr"}
    total = acct["queue_s"] + acct["startup_s"] + acct["productive_s"] + acct["lost_s"] + acct["shutdown_s"]
    assert abs(total - acct["wall_s"]) <= 1.0 and acct["incidents"] == 1
    assert tl.render().splitlines()[-1].startswith("ETTR 69.5 % over 2 min, 1 incident")


def test_a_running_job_is_counted_to_now() -> None:
    tl = timeline("local:x", JobTimes(submit=100.0, start=101.0, state="RUNNING", source="record"), [], now=160.0)
    assert tl.running and tl.account.wall_s == 60.0 and tl.account.productive_s == 59.0
    assert [e.kind for e in tl.events] == ["submit", "start"]


def test_the_plot_draws_two_attempts_and_one_fault(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _runner, sched = _slurm_job(tmp_path, monkeypatch)
    tl = gather(sched, "slurm", "57")
    bars, marks = plot_data(tl)
    assert sorted({b.attempt for b in bars}) == [0, 1] and len(bars) == 4  # two nodes each
    assert [(m.node, m.attempt, m.klass, m.time) for m in marks] == [("node2", 0, "node-failure", 58.0)]
    need("matplotlib", "the PNG needs the plot extra")
    from torchhpc.diagnose.events_plot import plot_timeline

    png = plot_timeline(tl, tmp_path / "events.png")
    head = Path(png).read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", head[16:24])
    assert width > 400 and height > 100
    from torchhpc.diagnose.events_plot import draw  # issue 64: the legend is not drawn over the x-axis label

    fig = draw(tl)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legend = fig.legends[0].get_window_extent(renderer)
    label = fig.axes[0].xaxis.label.get_window_extent(renderer)
    assert not legend.overlaps(label) and legend.y1 <= label.y0, (legend, label)


def test_clock_reads_each_format() -> None:
    assert clock("Unknown") is None and clock("") is None and clock(None) is None
    assert clock(1795768626.5) == 1795768626.5 and clock("1795768626") == 1795768626.0
    assert clock("Sat Nov 22 03:40:00 2026") == time.mktime((2026, 11, 22, 3, 40, 0, 0, 0, -1))


def test_a_job_neither_sacct_nor_scontrol_knows_is_an_error_that_names_it() -> None:
    from torchhpc.errors import SchedulerError

    runner = FakeRunner(responses={"sacct": "", "scontrol": (1, "", "slurm_load_jobs error: Invalid job id specified\n")})
    with pytest.raises(SchedulerError, match="slurm job 404"):
        SlurmScheduler(runner=runner).times("404")
    assert [c[0][0] for c in runner.calls] == ["sacct", "scontrol"]


def test_pbs_times_cost_what_status_costs() -> None:
    text = (DATA / "pbs" / "qstat_json_history.json").read_text()
    by_status = FakeRunner(responses={"qstat": text})
    PBSScheduler(runner=by_status).status("4711.pbsserver01")
    by_times = FakeRunner(responses={"qstat": text})
    PBSScheduler(runner=by_times).times("4711.pbsserver01")
    assert by_times.calls == by_status.calls and len(by_times.calls) == 1


def test_plot_without_matplotlib_is_a_clear_error_before_anything_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    from torchhpc.cli.main import main

    for name in list(sys.modules):
        if name == "matplotlib" or name.startswith("matplotlib."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails, find_spec finds nothing
    monkeypatch.setenv("TORCHHPC_STATE_DIR", str(tmp_path / "state"))
    rc = main(["events", "slurm:57", "--plot", str(tmp_path / "ev.png")])
    err = capsys.readouterr().err
    assert rc != 0 and "--plot needs matplotlib" in err and "torchhpc[plot]" in err, err
    assert not (tmp_path / "ev.png").exists()


def test_a_job_resized_after_a_node_loss_keeps_its_first_start_and_its_last_end() -> None:
    """Recorded on the dev cluster (tests/data/slurm/sacct_times_resized.txt): a job that lost a node is
    resized, and ``sacct -X`` gives a RESIZING row and the final one. The first dev-cluster run of the
    events test took the first row's End, 10 s before the job ended."""
    from torchhpc.schedulers.slurm.times import times_from_sacct

    text = (Path(__file__).parent.parent / "data" / "slurm" / "sacct_times_resized.txt").read_text()
    t = times_from_sacct(text, "5")
    assert t is not None and t.state == "COMPLETED"
    assert (t.start, t.end) == (clock("2026-11-27T09:30:35"), clock("2026-11-27T09:31:37"))
