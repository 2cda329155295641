"""The watch on the supervisor's own node (supervisor/sentinel.py): what it leaves when the batch host is lost."""

from __future__ import annotations

import json
from pathlib import Path

from torchhpc.jobdir.attempts import save_attempts
from torchhpc.supervisor.sentinel import batch_host_lost, sentinel_argv, watch


def test_the_loss_is_recorded_before_the_job_is_cancelled(tmp_path: Path) -> None:
    save_attempts(str(tmp_path), [{"attempt": 0, "nodes": ["node1", "node2"], "class": "node-failure",
                                   "excluded": ["node2"]}])
    (tmp_path / "slurm.out").write_text("torchhpc: job 5 on node[1-4]\n")
    seen: list[tuple[str, ...]] = []

    def cancel() -> None:  # by then the record must say everything: the cancel ends this process
        seen.append(tuple(sorted(p.name for p in tmp_path.iterdir())))

    line = batch_host_lost(str(tmp_path), "node1", 2, cancel, clock=lambda: 100.0)
    assert seen == [("attempts.json", "end.json", "slurm.out")]
    last = json.loads((tmp_path / "attempts.json").read_text())[-1]
    assert last["attempt"] == 1 and last["class"] == "node-failure" and last["excluded"] == ["node1", "node2"]
    assert json.loads((tmp_path / "end.json").read_text()) == {"state": "NODE_FAIL", "exit_code": 80, "time": 100.0,
                                                               "restart": 2}
    assert line in (tmp_path / "slurm.out").read_text() and "the batch host node1" in line


def test_the_watch_ends_only_after_misses_in_a_row() -> None:
    answers = iter([True, False, True, False, False, False])
    naps: list[float] = []
    watch(lambda: next(answers), every=2.0, misses=3, sleep=naps.append)
    assert naps == [2.0, 1.0, 2.0, 1.0, 1.0]
    assert sentinel_argv("py", "/d", "node1", 0)[1:3] == ["-m", "torchhpc.supervisor.sentinel"]


def test_stopping_an_attempt_leaves_the_watch_running() -> None:
    """The supervisor cancels an attempt's steps with every step of the job squeue lists: the watch's step
    (named WATCH_STEP with srun's --job-name) must outlive each attempt, or a later batch host loss is missed."""
    import subprocess
    import time

    from tests.fakes import FakeRunner
    from torchhpc.schedulers.slurm.allocation import WATCH_STEP
    from torchhpc.schedulers.slurm.slurm import SlurmScheduler

    runner = FakeRunner(responses={"squeue": f"7.0 bash\n7.1 {WATCH_STEP}\n7.2 bash\n", "scancel": ""})
    alloc = SlurmScheduler(runner=runner).allocation_of("7", {"SLURM_JOB_ID": "7"})
    step = subprocess.Popen(["sleep", "30"], start_new_session=True)
    alloc.kill_step(step, grace=0.0)
    deadline = time.monotonic() + 5
    while not any(argv[0] == "scancel" for argv, _ in runner.calls) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [argv for argv, _ in runner.calls if argv[0] == "scancel"] == [["scancel", "--signal=KILL", "7.0", "7.2"]]


def test_the_verdict_of_a_lost_batch_host_says_so(tmp_path: Path) -> None:
    from torchhpc.diagnose.evidence import Evidence
    from torchhpc.diagnose.verdict import diagnose
    from torchhpc.jobdir.attempts import load_attempts

    batch_host_lost(str(tmp_path), "node1", 0, lambda: None, clock=lambda: 100.0)
    v = diagnose(Evidence(state="NODE_FAIL", exit_code=80, attempts=load_attempts(str(tmp_path)), job="slurm:5"))
    assert v.klass == "node-failure" and v.summary.startswith("the batch host node1, where the supervisor ran"), v
    assert "--exclude node1" in v.next_step, v
