"""``list -s slurm`` and ``status A B`` in status's own fields (issue 70, item 13), from squeue as recorded.

Recorded on the dev cluster: the old ``squeue -o "%i|%T|%M|%D|%R|%j"`` gave ``14|RUNNING|0:06|1|node1|rq``, which
``list`` printed as ``nodes=1`` (a count), ``reason=node1`` (``%R`` is the node list of a running job) and
``elapsed=0:06``, where ``status`` says ``00:00:06``. The ``-O`` row below is the same job's.
"""

from __future__ import annotations

import pytest

from tests.fakes import FakeRunner
from torchhpc.schedulers.slurm.parse import elapsed_hms


@pytest.mark.parametrize(("used", "hms"), [("0:06", "00:00:06"), ("12:34", "00:12:34"), ("1:02:03", "01:02:03"),
                                           ("2-01:02:03", "2-01:02:03"), ("INVALID", "INVALID")])
def test_squeue_time_is_written_as_scontrol_writes_it(used: str, hms: str) -> None:
    assert elapsed_hms(used) == hms


def test_list_shows_node_names_the_reason_alone_and_the_job_directory(clean_user_env: None, tmp_path: object) -> None:
    from torchhpc.jobdir.record import update_record
    from torchhpc.schedulers.slurm.slurm import SlurmScheduler

    update_record("slurm", "14", job_dir="/scratch/out/rq-14")
    sched = SlurmScheduler(runner=FakeRunner(responses={"squeue": "14|RUNNING|0|0:06|node1|None|rq|\n"}))
    [st] = sched.list_jobs()
    assert (st.job_id, st.state, st.nodes, st.reason, st.elapsed, st.name) == ("14", "RUNNING", "node1", "", "00:00:06",
                                                                               "rq")
    assert st.log_dir == "/scratch/out/rq-14"


# recorded: `sacct -X -D` of a job requeued by `scontrol requeue` after 7 s, run again to its end
REQUEUED = ("14|2026-12-02T03:29:22|2026-12-02T03:29:23|2026-12-02T03:29:23|2026-12-02T03:29:30|REQUEUED|0:0|node1|None|rq\n"
            "14|2026-12-02T03:29:32|2026-12-02T03:30:03|2026-12-02T03:30:03|2026-12-02T03:30:34|COMPLETED|0:0|node1|BeginTime|rq\n")


def test_a_requeued_jobs_times_keep_its_first_submit_and_its_first_run() -> None:
    """Issue 70, item 11: events of a requeued job began at the requeue and forgot its first run."""
    from torchhpc.schedulers.slurm.times import sacct_times_argv, times_from_sacct
    from torchhpc.schedulers.times import clock

    assert "-D" in sacct_times_argv("14")
    t = times_from_sacct(REQUEUED, "14")
    assert t is not None
    assert t.submit == clock("2026-12-02T03:29:22") and t.start == clock("2026-12-02T03:30:03"), t
    assert (t.state, t.exit_code) == ("COMPLETED", 0)
    assert t.reasons[0] == (clock("2026-12-02T03:29:30"),
                            "requeued: its run 1 on node1 (03:29:23 to 03:29:30) ended, the job waited again")


def test_a_requeued_jobs_hold_is_slurms_not_a_users_begin() -> None:
    """Issue 70's wording list: the hold Slurm puts on a requeued job was explained as a user's --begin.
    The fields as scontrol showed job 14 pending again after `scontrol requeue` (recorded on the dev cluster)."""
    from torchhpc.schedulers.slurm.pending import classify

    job = {"JobId": "14", "JobState": "PENDING", "Reason": "BeginTime", "Restarts": "1", "Partition": "debug",
           "StartTime": "2026-12-02T03:30:03", "NumNodes": "1"}
    why = classify(job, {})
    assert why.category == "begin_time" and why.summary.startswith("requeued (restart 1)"), why
    assert "--begin" not in " ".join(why.lines()), why


def test_a_pending_wait_prints_a_line_per_change_not_per_second() -> None:
    """Issue 70's noise list: `wait` printed one line a second while pending (an hour in the queue: 3,600 lines)."""
    import io

    from torchhpc.cli.common import Progress

    out = io.StringIO()
    p = Progress(out)
    for waited in range(5):
        p.update(f"slurm:14 PENDING (BeginTime) waited {waited}s")
    p.update("slurm:14 RUNNING elapsed 00:00:01")
    p.update("slurm:14 RUNNING elapsed 00:00:02")
    assert out.getvalue().splitlines() == ["slurm:14 PENDING (BeginTime) waited 0s", "slurm:14 RUNNING elapsed 00:00:01"]


def test_list_last_is_the_job_submitted_last_even_once_it_left_the_queue(clean_user_env: None) -> None:
    """Issue 70, item 13: after a short `run --wait`, `list --last` printed nothing (the queue was empty)."""
    from torchhpc.cli.jobs import _last
    from torchhpc.jobdir.record import new_record, save_record
    from torchhpc.schedulers.slurm.slurm import SlurmScheduler

    save_record(new_record("slurm", "16", name="older"))
    save_record(new_record("slurm", "17", name="w2").with_(submitted=9e9))
    done = "JobId=17 JobName=w2 JobState=COMPLETED Reason=None Restarts=0 ExitCode=0:0 RunTime=00:00:27 NodeList=node1\n"
    sched = SlurmScheduler(runner=FakeRunner(responses={"scontrol": done}))
    assert [(st.job_id, st.state) for st in _last(sched, "slurm", [])] == [("17", "COMPLETED")]


def test_slurmstepds_line_is_no_ranks() -> None:
    """Recorded in an srun job's slurm.out at its time limit: slurmstepd's line behind task 0's label was filed
    under rank 0 (``logs --rank 0``, the verdict's evidence)."""
    from torchhpc.jobdir.logs import parse_line

    line = "0: slurmstepd-node1: error: *** STEP 4.0 ON node1 CANCELLED AT 2026-12-02T03:08:46 DUE TO TIME LIMIT ***"
    for launcher in ("srun", "torchrun"):
        assert parse_line(line, launcher, 1).rank is None, launcher
    assert parse_line("0: step 3", "srun", 1).rank == 0


def test_events_of_a_requeued_job_count_each_run_and_the_requeue() -> None:
    """Issue 70, item 11: "0 incidents", the first run forgotten, the submit the requeue's."""
    from torchhpc.diagnose.events import timeline
    from torchhpc.schedulers.slurm.times import times_from_sacct

    t = times_from_sacct(REQUEUED, "14")
    assert t is not None and len(t.runs) == 1
    tl = timeline("slurm:14", t, [], now=2e9)
    assert [e.kind for e in tl.events][:3] == ["submit", "start", "pending"], tl.events
    assert any(n.startswith("requeued 1 time, not supervised: each run is an attempt") for n in tl.notes), tl.notes
    # 72 s: queued 1 s, ran 7 s, waited out its requeue 33 s (lost: the incident's restart), ran again 31 s
    a = tl.account
    assert (round(a.wall_s), round(a.queue_s), round(a.productive_s), round(a.lost_s)) == (72, 1, 38, 33), a
    assert [(i.klass, round(i.restart_s)) for i in a.incidents] == [("requeued", 33)], a.incidents
