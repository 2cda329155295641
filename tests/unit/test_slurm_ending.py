"""One code per ending (schedulers/slurm/ending.py): the job's end.json, scontrol and sacct reconciled.

Every row below was recorded on the dev cluster (Slurm 22.05.8, 2026-12-02) for issue 70's endings: the
end marker the batch shell wrote, ``scontrol show job -o``'s ExitCode while the controller remembered
the job, and ``sacct``'s row after (``CANCELLED by 0|0:0`` and ``TIMEOUT|0:0``: accounting dropped the
143 the batch shell exited with). Read either way, each ending has the README table's code.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fakes import FakeRunner
from torchhpc.jobdir.layout import HANG
from torchhpc.schedulers.slurm.ending import one_ending

GONE = (1, "", "slurm_load_jobs error: Invalid job id specified\n")

# ending: (end.json or None, scontrol's ExitCode and JobState, sacct's -o SACCT_FIELDS row, hang.json, the code)
ENDINGS = {
    # `run --wait --hang-timeout 20`: the client's watch saved hang.json, then cancelled
    "hang under the client's watch": ('{"state": "CANCELLED", "exit_code": 143, "time": 1796180881.667422, "restart": 0}',
                                      "CANCELLED", "143:0", "3|CANCELLED by 0|0:0|00:00:31|node1|hg", True, 81),
    "cancel while running": ('{"state": "CANCELLED", "exit_code": 143, "time": 1796180696.625785, "restart": 0}',
                             "CANCELLED", "143:0", "1|CANCELLED by 0|0:0|00:00:07|node1|cr", False, 143),
    # never started: no batch shell, no marker; Slurm records 0:0 for it everywhere
    "cancel while pending": (None, "CANCELLED", "0:0", "2|CANCELLED by 0|0:0|00:00:00|None assigned|cp", False, 143),
    # torchrun under the limit: its step exits 1 after Slurm's SIGTERM, the batch shell's TERM trap says CANCELLED
    "time limit, the stop ignored": ('{"state": "CANCELLED", "exit_code": 1, "time": 1796180928.466343, "restart": 0}',
                                     "TIMEOUT", "1:0", "4|TIMEOUT|0:0|00:01:15|node1|to", False, 143),
    # the ranks took the stop, --max-requeues 0: the batch script ends 85 (schedulers/slurm/requeue.py)
    "time limit, stop taken, requeues used up": (
        '{"state": "FAILED", "exit_code": 85, "time": 1796180863.201721, "restart": 0}',
        "FAILED", "85:0", "5|FAILED|85:0|00:00:13|node1|tl", False, 85),
}


def _job(tmp_path: Path, job_id: str, mark: str | None, hang: bool) -> None:
    from torchhpc.jobdir.record import update_record

    job_dir = tmp_path / f"job-{job_id}"
    job_dir.mkdir()
    if mark is not None:
        (job_dir / "end.json").write_text(mark + "\n")
    if hang:
        (job_dir / HANG).write_text(json.dumps({"quiet_s": 20.0}))
    update_record("slurm", job_id, job_dir=str(job_dir))


@pytest.mark.parametrize("ending", ENDINGS)
def test_each_ending_has_one_code_from_scontrol_and_from_sacct(clean_user_env: None, tmp_path: Path,
                                                              ending: str) -> None:
    from torchhpc.schedulers.slurm.slurm import SlurmScheduler

    mark, state, exit_field, row, hang, code = ENDINGS[ending]
    job_id = row.split("|")[0]
    _job(tmp_path, job_id, mark, hang)
    scontrol = f"JobId={job_id} JobName=x JobState={state} Reason=None Restarts=0 ExitCode={exit_field} NodeList=node1\n"
    known = SlurmScheduler(runner=FakeRunner(responses={"scontrol": scontrol, "sacct": ""}))
    forgotten = SlurmScheduler(runner=FakeRunner(responses={"scontrol": GONE, "squeue": GONE, "sacct": row + "\n"}))
    assert known.status(job_id).exit_code == code, "at once (scontrol)"
    if code == 85:  # the batch script's end after a time-limit stop: what ended it, not FAILED
        assert known.status(job_id).state == forgotten.status(job_id).state == "TIMEOUT"
        assert known.status(job_id).reason.startswith("the ranks stopped at the time limit"), "not NonZeroExitCode"
    assert forgotten.status(job_id).exit_code == code, "after accounting took over (sacct)"
    assert forgotten.query_many([job_id])[job_id].exit_code == code, "status of several handles"
    parts = row.split("|")
    times_row = "|".join([job_id, *["2026-12-02T03:07:30"] * 4, parts[1], parts[2], parts[4], "None", parts[5]])
    assert SlurmScheduler(runner=FakeRunner(responses={"sacct": times_row})).times(job_id).exit_code == code, "events"


def test_a_hang_long_before_the_end_is_not_its_cause(tmp_path: Path) -> None:
    """The supervisor restarted after a hang (hang.json stays), and a person cancelled the job an hour
    later: that end is a cancel, 143."""
    (tmp_path / HANG).write_text("{}")
    (tmp_path / "end.json").write_text('{"state": "CANCELLED", "exit_code": 143, "time": 9999999999.0}')
    assert one_ending("CANCELLED", 143, str(tmp_path)) == ("CANCELLED", 143)


def test_an_earlier_runs_marker_and_an_unended_job_keep_the_schedulers_word(tmp_path: Path) -> None:
    (tmp_path / "end.json").write_text('{"state": "FAILED", "exit_code": 3, "time": 1, "restart": 0}')
    assert one_ending("FAILED", 1, str(tmp_path), restarts=1) == ("FAILED", 1)  # requeued since: not this run's
    assert one_ending("RUNNING", None, str(tmp_path)) == ("RUNNING", None)
    assert one_ending("COMPLETED", 0, None) == ("COMPLETED", 0)


# recorded: --after-ok of a job that failed; Slurm ended it (kill-on-invalid-dep) before it ever started
NEVER_STARTED = ("JobId=7 JobName=sleepy JobState=CANCELLED Reason=DependencyNeverSatisfied Dependency=afterok:6(failed)"
                 " Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=20789-03:12:52 TimeLimit=UNLIMITED"
                 " SubmitTime=2026-12-02T03:12:51 EligibleTime=Unknown AccrueTime=Unknown StartTime=Unknown"
                 " EndTime=2026-12-02T03:12:52 NodeList= NumNodes=1\n")


def test_a_job_that_never_started_ran_for_no_time() -> None:
    """Issue 70, item 6: scontrol's RunTime of a job that never started is now minus the epoch."""
    from torchhpc.schedulers.slurm.parse import parse_scontrol, status_from_scontrol

    st = status_from_scontrol("7", parse_scontrol(NEVER_STARTED))
    assert st.elapsed == "00:00:00", st


# recorded slurm.out lines of two one-rank jobs on the dev cluster: the limit came and the program ignored the
# stop (job 4, torchrun), and the ranks took the stop with --max-requeues 0 (job 6, srun)
IGNORED = ["torchhpc: job 4 on node1, master 10.77.0.11:10004, launcher torchrun, 1x1 ranks",
           "torchhpc: time-limit at 03:07:45: asking every rank to checkpoint and stop",
           "slurmstepd-node1: error: *** JOB 4 ON node1 CANCELLED AT 2026-12-02T03:08:46 DUE TO TIME LIMIT ***",
           "torchhpc: ended-by-slurm at 03:08:46: asking every rank to checkpoint and stop"]
TAKEN = ["torchhpc: job 6 on node1, master 10.77.0.11:10006, launcher srun, 1x1 ranks",
         "torchhpc: time-limit at 03:10:12: asking every rank to checkpoint and stop",
         "torchhpc: not requeuing: --max-requeues 0 used up",
         "torchhpc: the ranks stopped at the time-limit and the job is not requeued: its work is unfinished "
         "(exit 85, time-limit)"]


@pytest.mark.parametrize(("lines", "code", "said"), [(IGNORED, 143, "asked to stop at 03:07:45 (the warning) and none "
                                                      "stopped"), (TAKEN, 85, "its work is unfinished")])
def test_the_time_limit_verdict_says_when_the_ranks_were_asked_and_blames_no_peer(lines: list[str], code: int,
                                                                                said: str) -> None:
    """Issue 70, item 12: it pointed to docs/stop.md (there is none) and blamed "a lost peer" in a one-rank job."""
    from tests.conftest import REPO
    from torchhpc.diagnose.evidence import Evidence
    from torchhpc.diagnose.verdict import diagnose
    from torchhpc.jobdir.logs import Line

    v = diagnose(Evidence(lines=[Line(None, t) for t in lines], state="TIMEOUT", exit_code=code, launcher="srun",
                          rank_logs={0: "ranks/rank-0@node1.log"}, job="slurm:6"))
    text = v.render()
    assert v.klass == "time-limit" and said in v.summary, text
    assert "peer" not in text and "rank 0 was stopped with it" in text, text
    for doc in ("docs/stop.md", "docs/nothing-lost.md"):
        assert doc not in text or (REPO / doc).exists(), text


def test_a_completing_job_shows_all_its_nodes(clean_user_env: None) -> None:
    """Recorded after node2 of node[1-2] died (no spare left): COMPLETING, scontrol's NodeList names only the dead
    node still cleaning up; sacct has the job's nodes."""
    from torchhpc.schedulers.slurm.slurm import SlurmScheduler

    scontrol = ("JobId=1 JobName=nf JobState=COMPLETING Reason=NonZeroExitCode Restarts=0 ExitCode=80:0 "
                "RunTime=00:00:15 StartTime=2026-12-02T03:24:55 NodeList=node2 BatchHost=node1 NumNodes=1\n")
    sched = SlurmScheduler(runner=FakeRunner(responses={"scontrol": scontrol, "sacct": "node[1-2]\n"}))
    assert sched.status("1").nodes == "node[1-2]"


def test_a_node_loss_with_no_spare_left_is_node_failure_in_the_supervisors_words() -> None:
    """Issue 70, item 15: attempts.json said node-failure, diagnose said "unknown — no evidence names a cause".
    The attempts and the supervisor's lines as recorded on the dev cluster (--nodes 2 --max-restarts 1, node2 failed)."""
    from torchhpc.diagnose.evidence import Evidence
    from torchhpc.diagnose.verdict import diagnose
    from torchhpc.jobdir.logs import Line

    attempts = [{"attempt": 0, "nodes": ["node1", "node2"], "excluded": ["node2"], "exit_code": -9, "rank": None,
                 "detail": "node2 unreachable", "found_by": "probe", "class": "node-failure"}]
    lines = ["torchhpc: supervisor: attempt 0 ended: node-failure: node2 unreachable; excluded node2",
             "torchhpc: supervisor: only 1 healthy node (node1) for 2; excluded: node2: the job ends (node-failure)"]
    for state in ("NODE_FAIL", "FAILED"):  # read back with its end marker (slurm/ending.py), and without
        v = diagnose(Evidence(lines=[Line(None, t) for t in lines], state=state, exit_code=80, attempts=attempts,
                              launcher="srun", job="slurm:1"))
        assert v.klass == "node-failure", (state, v.render())
        assert "node2 lost" in v.summary and "--exclude node2" in v.next_step, v.render()


def test_a_cancel_torchhpc_made_says_who_and_when(clean_user_env: None, tmp_path: Path) -> None:
    """Issue 70's wording list: "who cancelled it is not recorded" for a cancel torchhpc made; and a job cancelled
    while pending showed the reason it had waited for (PartitionNodeLimit) as the reason it ended."""
    from torchhpc.diagnose.evidence import Evidence
    from torchhpc.diagnose.verdict import diagnose
    from torchhpc.jobdir.record import load_record
    from torchhpc.schedulers.slurm.slurm import SlurmScheduler

    _job(tmp_path, "2", None, False)
    pending = "JobId=2 JobName=cp JobState=CANCELLED Reason=PartitionNodeLimit Restarts=0 ExitCode=0:0 StartTime=Unknown\n"
    sched = SlurmScheduler(runner=FakeRunner(responses={"scancel": "", "scontrol": pending}))
    sched.cancel("2")
    record = load_record("slurm", "2")
    assert record is not None and record.cancelled.startswith(f"{__import__('getpass').getuser()} at ")
    st = sched.status("2")
    assert (st.state, st.exit_code) == ("CANCELLED", 143) and st.reason.startswith("cancelled by torchhpc (user "), st
    v = diagnose(Evidence(state=st.state, exit_code=st.exit_code, reason=st.reason, job="slurm:2"))
    assert v.summary.startswith("the job was cancelled by torchhpc (user "), v.render()
    SlurmScheduler(runner=FakeRunner(responses={"scancel": ""})).cancel("77")  # not submitted here: no record made
    assert load_record("slurm", "77") is None
