"""End markers and the light wait: the batch script's end helper run by a real bash (exit, failure,
SIGTERM), the marker's reader and writer, and the wait's schedule of controller questions (a fake
clock and a status function that counts; the real cluster's count is benchmarks/controller_load.py)."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest

from torchhpc.core.spec import Entrypoint, JobSpec
from torchhpc.jobdir.endmark import end_lines, quoted_dir, read_end, write_end
from torchhpc.jobdir.layout import END
from torchhpc.launchers.boot import BOOT_DIR
from torchhpc.schedulers.api import JobStatus
from torchhpc.schedulers.waiting import CAP, EndWatch, settled


def test_write_then_read_is_whole_and_leaves_no_temporary(tmp_path: Path) -> None:
    assert read_end(str(tmp_path)) is None
    assert write_end(str(tmp_path), "FAILED", 3, when=12.5)
    mark = read_end(str(tmp_path))
    assert mark is not None and (mark.state, mark.exit_code, mark.time) == ("FAILED", 3, 12.5)
    assert sorted(os.listdir(tmp_path)) == [END]
    (tmp_path / END).write_text("{not json")
    assert read_end(str(tmp_path)) is None
    assert not write_end(str(tmp_path / "missing"), "COMPLETED", 0)


def _script(job_dir: Path, body: str, cancel_trap: bool = True) -> str:
    lines = ["#!/bin/bash", "set -euo pipefail", f"export TORCHHPC_BOOT_DIR={shlex.quote(BOOT_DIR)}",
             *end_lines(quoted_dir(str(job_dir.parent) + "/j-", "$JOBID"), cancel_trap=cancel_trap), body]
    return "\n".join(lines) + "\n"


# A step that says when it runs: the cancel must reach the shell after its trap is armed. A fixed
# 0.5 s sleep assumed bash starts within it, which a loaded CI machine need not honour.
def _step(job_dir: Path) -> str:
    return f"sleep 30 & touch {shlex.quote(str(job_dir))}.step; wait $!"


def _kill_group(pid: int) -> None:
    """What is left of the script's process group, if any. Run X's killpg raised ESRCH: the step
    then said it ran before it had started its `sleep` (now it says so after), and the cancel came
    in between, so the group had ended with the shell."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def _await_step(job_dir: Path) -> None:
    deadline = time.monotonic() + 60
    while not Path(f"{job_dir}.step").exists():
        assert time.monotonic() < deadline, "the step never started"
        time.sleep(0.02)


@pytest.mark.parametrize(("body", "state", "code"), [
    ("true", "COMPLETED", 0),
    ("sh -c 'exit 3'", "FAILED", 3),
    ("_torchhpc_end_state=REQUEUED", None, None),
])
def test_the_script_writes_its_end(tmp_path: Path, body: str, state: str | None, code: int | None) -> None:
    """Also a failing command under ``set -e``: the EXIT trap writes it; a requeue from the script writes none."""
    d = tmp_path / "j-7 x"
    d.mkdir()
    (d / END).write_text('{"state": "COMPLETED", "exit_code": 0, "time": 1}')  # an earlier run's: removed
    path = tmp_path / "job.sh"
    path.write_text(_script(d, body))
    done = subprocess.run(["bash", str(path)], env={**os.environ, "JOBID": "7 x"}, check=False)
    mark = read_end(str(d))
    if state is None:
        assert mark is None
        return
    assert mark is not None and (mark.state, mark.exit_code) == (state, code) and done.returncode == code
    assert abs(mark.time - time.time()) < 60
    assert json.loads((d / END).read_text())["restart"] == 0


def test_a_cancel_while_the_step_runs_writes_cancelled(tmp_path: Path) -> None:
    """SIGTERM (scancel) reaches the batch shell while its step runs: the step ends, the trap writes the end."""
    d = tmp_path / "j-8"
    d.mkdir()
    path = tmp_path / "job.sh"
    path.write_text(_script(d, _step(d)))
    proc = subprocess.Popen(["bash", str(path)], env={**os.environ, "JOBID": "8"}, start_new_session=True)
    try:
        _await_step(d)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 143
    finally:
        _kill_group(proc.pid)  # the step's `sleep 30` (Slurm kills the step; nothing does here)
    mark = read_end(str(d))
    assert mark is not None and mark.state == "CANCELLED"


def test_no_directory_no_marker_and_the_exit_status_kept(tmp_path: Path) -> None:
    """A script submitted by hand has no job directory: nothing is written, its status is its own."""
    path = tmp_path / "job.sh"
    path.write_text(_script(tmp_path / "j-9", "exit 5"))
    assert subprocess.run(["bash", str(path)], env={**os.environ, "JOBID": "9"}, check=False).returncode == 5
    assert not (tmp_path / "j-9").exists()


def test_slurm_and_pbs_scripts_arm_the_marker(tmp_path: Path) -> None:
    from torchhpc.schedulers.pbs.pbs import PBSScheduler
    from torchhpc.schedulers.slurm.slurm import SlurmScheduler

    spec = JobSpec(entrypoint=Entrypoint.parse(["train.py"], python="python3"), name="t", nodes=2,
                   launcher="srun", scheduler="slurm", output_dir=str(tmp_path))
    text = SlurmScheduler().render_script(spec)
    assert f'"$TORCHHPC_BOOT_DIR/end.sh" {tmp_path}/t-"$SLURM_JOB_ID" "${{SLURM_RESTART_COUNT:-0}}"' in text
    arr = SlurmScheduler().render_script(spec.with_(array="0-3"))
    assert '"${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"' in arr
    pbs = PBSScheduler().render_script(spec.with_(launcher="mpirun", scheduler="pbs"))
    assert '"${PBS_JOBID%%[!0-9]*}"' in pbs


SRUN_OUT = """torchhpc: job 41 on node[1-2], master 10.0.0.1:10041, launcher srun, 2x2 ranks
srun: error: node2: task 2: Exited with exit code 1
srun: launch/slurm: _step_signal: Terminating StepId=41.0
0: slurmstepd-node1: error: *** STEP 41.0 ON node1 CANCELLED AT 2026-11-29T17:49:53 ***
srun: error: node2: task 3: Terminated
srun: error: node1: tasks 0-1: Terminated
srun: Force Terminated StepId=41.0
"""


# torchrun under srun --label (the Slurm script's): the node agent's ChildFailedError, then srun's report
# of the agents' ends. torchrun exits 1 whatever its worker's own code; its root cause names that code.
TORCHRUN_OUT = """torchhpc: job 44 on node[1-2], master 10.0.0.1:10044, launcher torchrun, 2x2 ranks
1: torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
1: ============================================================
1: python FAILED
1: ------------------------------------------------------------
1: Failures:
1: [1]:
1:   time      : 2026-11-29_22:00:01
1:   host      : node2
1:   rank      : 2 (local_rank: 0)
1:   exitcode  : -15 (pid: 811) Signal 15 (SIGTERM) received by PID 811
1:   error_file: <N/A>
1: ------------------------------------------------------------
1: Root Cause (first observed failure):
1: [0]:
1:   time      : 2026-11-29_22:00:00
1:   host      : node2
1:   rank      : 3 (local_rank: 1)
1:   exitcode  : 3 (pid: 812)
1:   error_file: <N/A>
1: ============================================================
srun: error: node2: task 1: Exited with exit code 1
srun: error: node1: task 0: Exited with exit code 1
"""

BOOT = {"TORCHHPC_BOOT_DIR": BOOT_DIR}  # first_end.sh, as the batch script finds it


def _own_script(job_dir: Path, body: str) -> str:
    words = quoted_dir(str(job_dir.parent) + "/j-", "$JOBID")
    lines = ["#!/bin/bash", "set -euo pipefail", f"export TORCHHPC_BOOT_DIR={shlex.quote(BOOT_DIR)}",
             *end_lines(words, own_code_files=f"slurm.out {words}.out"), body]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(("out", "code"), [
    (SRUN_OUT, 1),  # the rank's own 1, not srun's 143
    (SRUN_OUT.replace("Exited with exit code 1", "Aborted (core dumped)"), 134),
    (SRUN_OUT.replace("task 2: Exited with exit code 1", "task 2: Segmentation fault"), 139),
    (SRUN_OUT.replace("task 2: Exited with exit code 1", "tasks 2-3: Killed"), 137),
    (SRUN_OUT.replace("Exited with exit code 1", "Terminated"), 143),  # a SIGTERM first: srun's own kept
    # a requeued job appends: the first run's report does not speak for this one
    (SRUN_OUT + SRUN_OUT.replace("Exited with exit code 1", "Exited with exit code 7").replace("task 3: Terminated",
                                                                                           "task 3: Bus error"), 7),
    ("torchhpc: job 41 on node1\n2: srun: error: node2: task 2: Exited with exit code 9\n", 143),  # a rank's line
    ("", 143),
    (TORCHRUN_OUT, 3),  # torchrun's 1 (here srun's 143 above it): its root cause's own 3
    (TORCHRUN_OUT.replace("exitcode  : 3 (pid: 812)", "exitcode  : -6 (pid: 812) Signal 6 (SIGABRT)"), 134),
    (TORCHRUN_OUT.replace("exitcode  : 3 (pid: 812)", "exitcode  : -15 (pid: 812)"), 1),  # stopped: not a cause
    (TORCHRUN_OUT.replace("1: ", ""), 3),  # by hand without --label
    (TORCHRUN_OUT + SRUN_OUT.replace("job 41", "job 44"), 1),  # requeued: this run's report only
], ids=["exit", "abort", "segv", "killed", "terminated-first", "requeued", "a-rank-line", "empty",
        "torchrun", "torchrun-abort", "torchrun-sigterm", "torchrun-unlabelled", "torchrun-requeued"])
def test_a_failed_step_ends_with_the_first_ranks_own_code(tmp_path: Path, out: str, code: int) -> None:
    """srun's status is its tasks' highest (SIGTERM's 143 once --kill-on-bad-exit stopped the others), and
    torchrun's is 1 whatever its worker's: the end helper reads the launcher's report and ends the job,
    marker and shell, with the first failed rank's own code."""
    d = tmp_path / "j-41 'x'"
    d.mkdir()
    (d / "slurm.out").write_text(out)
    path = tmp_path / "job.sh"
    path.write_text(_own_script(d, "exit 143"))
    done = subprocess.run(["bash", str(path)], env={**os.environ, "JOBID": "41 'x'", **BOOT}, check=False)
    mark = read_end(str(d))
    assert mark is not None and (mark.state, mark.exit_code, done.returncode) == ("FAILED", code, code)


def test_torchruns_own_1_becomes_its_workers_code_and_a_success_reads_nothing(tmp_path: Path) -> None:
    """The status srun passes on from torchrun is 1 when the agents all failed: the worker's 3 replaces it.
    A job that succeeded reads no report (a stale root cause in its output changes nothing)."""
    d = tmp_path / "j-44"
    d.mkdir()
    (d / "slurm.out").write_text(TORCHRUN_OUT)
    path = tmp_path / "job.sh"
    path.write_text(_own_script(d, "exit 1"))
    assert subprocess.run(["bash", str(path)], env={**os.environ, "JOBID": "44", **BOOT}, check=False).returncode == 3
    path.write_text(_own_script(d, "true"))
    assert subprocess.run(["bash", str(path)], env={**os.environ, "JOBID": "44", **BOOT}, check=False).returncode == 0
    mark = read_end(str(d))
    assert mark is not None and (mark.state, mark.exit_code) == ("COMPLETED", 0)


def test_by_hand_the_scripts_own_output_is_read_and_a_cancel_is_kept(tmp_path: Path) -> None:
    """``sbatch FILE`` has no job directory: the script's own --output names the report; the shell's status
    is still the task's. A cancel (SIGTERM to the batch shell) stays 143 whatever srun printed."""
    (tmp_path / "j-42.out").write_text(SRUN_OUT.replace("code 1", "code 4"))
    path = tmp_path / "job.sh"
    path.write_text(_own_script(tmp_path / "j-42", "exit 143"))
    assert subprocess.run(["bash", str(path)], env={**os.environ, "JOBID": "42", **BOOT}, check=False).returncode == 4
    assert not (tmp_path / "j-42").exists()
    d = tmp_path / "j-43"
    d.mkdir()
    (d / "slurm.out").write_text(SRUN_OUT)
    path.write_text(_own_script(d, _step(d)))
    proc = subprocess.Popen(["bash", str(path)], env={**os.environ, "JOBID": "43", **BOOT}, start_new_session=True)
    try:
        _await_step(d)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 143
    finally:
        _kill_group(proc.pid)
    mark = read_end(str(d))
    assert mark is not None and (mark.state, mark.exit_code) == ("CANCELLED", 143)


def test_only_an_unsupervised_srun_or_torchrun_step_reads_its_report(tmp_path: Path) -> None:
    from torchhpc.schedulers.slurm.slurm import SlurmScheduler

    spec = JobSpec(entrypoint=Entrypoint.parse(["train.py"], python="python3"), name="t", nodes=2,
                   launcher="srun", scheduler="slurm", output_dir=str(tmp_path))
    s = SlurmScheduler()
    assert s.own_code_files(spec) == f'slurm.out {tmp_path}/t-"$SLURM_JOB_ID".out'
    assert s.own_code_files(spec.with_(array="0-3")) == f'{tmp_path}/t-"${{SLURM_ARRAY_JOB_ID}}_${{SLURM_ARRAY_TASK_ID}}".out'
    assert end_line(s.render_script(spec)).endswith(s.own_code_files(spec))
    assert s.own_code_files(spec.with_(launcher="torchrun")) == s.own_code_files(spec)
    # mpirun exits with its first failed process's own code; a supervised job with its failure's class
    for other in (spec.with_(launcher="mpirun"), spec.with_(max_restarts=1), spec.with_(launcher="torchrun", max_restarts=1)):
        assert s.own_code_files(other) == "" and end_line(s.render_script(other)).endswith('"${SLURM_RESTART_COUNT:-0}"')


def end_line(script: str) -> str:
    """The script's line that sources boot/end.sh: its last words name the launcher's report, if any."""
    return script.split('. "$TORCHHPC_BOOT_DIR/end.sh" ', 1)[1].split("\n\n", 1)[0].replace(" \\\n  ", " ")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _run(watch: EndWatch, clock: Clock, until: float, events: dict[float, object] | None = None) -> list[float]:
    """Step the watch as Scheduler.wait does, on a fake clock; the times of the controller's questions."""
    asked: list[float] = []
    while clock.now < until and not watch.ended:
        before = watch.calls
        watch.step()
        if watch.calls > before:
            asked.append(clock.now)
        clock.now += max(watch.pause(), 0.01)
        for at, fn in list((events or {}).items()):
            if clock.now >= at:
                fn()  # type: ignore[operator]
                del events[at]  # type: ignore[union-attr]
    return asked


def test_a_long_wait_asks_at_most_twice_a_minute_after_the_first(tmp_path: Path) -> None:
    clock = Clock()
    watch = EndWatch(lambda: JobStatus("1", "RUNNING"), str(tmp_path), clock=clock)
    asked = _run(watch, clock, 300.0)
    assert len([t for t in asked if t < 60]) <= 6
    late = [t for t in asked if t >= 60]
    assert late and all(b - a >= CAP - 0.01 for a, b in zip(late, late[1:]))
    assert len([t for t in asked if 60 <= t < 120]) <= 2


def test_without_a_visible_directory_it_polls_as_before() -> None:
    clock = Clock()
    watch = EndWatch(lambda: JobStatus("1", "RUNNING"), None, poll=1.0, clock=clock)
    assert len(_run(watch, clock, 60.0)) >= 55


def test_a_marker_is_confirmed_at_once_and_returned_within_a_stat_poll(tmp_path: Path) -> None:
    clock = Clock()
    state = {"s": "RUNNING"}
    watch = EndWatch(lambda: JobStatus("1", state["s"], exit_code=None), str(tmp_path), clock=clock)

    def end() -> None:
        write_end(str(tmp_path), "FAILED", 4)
        state["s"] = "FAILED"

    asked = _run(watch, clock, 300.0, {100.0: end})
    assert watch.ended and watch.last is not None
    assert watch.last.state == "FAILED" and watch.last.exit_code == 4  # the marker's code where scontrol gave none
    assert asked[-1] - 100.0 <= 0.15


def test_running_after_the_marker_is_the_end_in_the_markers_words(tmp_path: Path) -> None:
    """The controller hears of the batch shell's exit a moment after the marker: one question confirms it."""
    clock = Clock()
    watch = EndWatch(lambda: JobStatus("1", "RUNNING", nodes="node1"), str(tmp_path), clock=clock)
    watch.step()  # first question: RUNNING
    write_end(str(tmp_path), "FAILED", 2)
    asked = _run(watch, clock, 10.0)
    assert watch.ended and watch.last is not None
    assert (watch.last.state, watch.last.exit_code, watch.last.nodes) == ("FAILED", 2, "node1")
    assert len(asked) == 1 and asked[0] <= 0.15


def test_a_marker_of_an_earlier_run_is_told_by_the_restart_count(tmp_path: Path) -> None:
    clock = Clock()
    write_end(str(tmp_path), "CANCELLED", 143, restart=0)
    watch = EndWatch(lambda: JobStatus("1", "RUNNING", restarts=1), str(tmp_path), clock=clock)
    _run(watch, clock, 100.0)
    assert not watch.ended


def test_a_requeued_jobs_old_marker_is_ignored_until_the_next_run_writes_its_own(tmp_path: Path) -> None:
    clock = Clock()
    state = {"s": "PENDING"}
    write_end(str(tmp_path), "CANCELLED", 143)  # the first run's end, before Slurm requeued it
    watch = EndWatch(lambda: JobStatus("1", state["s"]), str(tmp_path), clock=clock)

    def next_run_ends() -> None:
        (tmp_path / END).unlink()
        write_end(str(tmp_path), "COMPLETED", 0, restart=1)
        state["s"] = "COMPLETED"

    asked = _run(watch, clock, 300.0, {200.0: next_run_ends})
    assert watch.ended and watch.last is not None and watch.last.state == "COMPLETED"
    assert len([t for t in asked if 60 <= t < 120]) <= 2  # the old marker does not make it ask more
    assert asked[-1] - 200.0 <= 0.15


@pytest.mark.parametrize("said", ["COMPLETING", "RUNNING"])
def test_status_after_the_end_says_what_wait_said(tmp_path: Path, said: str) -> None:
    """`wait` returns on the marker; a `status` a moment later must not say COMPLETING (issue 53's
    parallel run caught `status --json` saying COMPLETING right after `run --wait` said FAILED 3)."""
    write_end(str(tmp_path), "FAILED", 3)
    st = settled(JobStatus("1", said, nodes="n[1-2]"), str(tmp_path))
    assert (st.state, st.exit_code, st.nodes) == ("FAILED", 3, "n[1-2]")


def test_status_keeps_the_controllers_word_otherwise(tmp_path: Path) -> None:
    assert settled(JobStatus("1", "COMPLETING"), str(tmp_path)).state == "COMPLETING"  # no marker yet
    assert settled(JobStatus("1", "COMPLETING"), None).state == "COMPLETING"  # no directory seen here
    write_end(str(tmp_path), "CANCELLED", 143, restart=0)
    assert settled(JobStatus("1", "PENDING"), str(tmp_path)).state == "PENDING"  # requeued: the old run's
    assert settled(JobStatus("1", "RUNNING", restarts=1), str(tmp_path)).state == "RUNNING"
    assert settled(JobStatus("1", "FAILED", exit_code=1), str(tmp_path)).exit_code == 1  # terminal: as said


def test_a_wait_that_times_out_on_a_pending_job_names_the_schedulers_reason() -> None:
    """The CI failure that asked for it read "still PENDING after 240s": not whether the job waited for
    nodes, a dependency or a limit. ``torchhpc wait --timeout`` and ``Executor.result(timeout=)`` say it."""
    from torchhpc.errors import WaitTimeout
    from torchhpc.schedulers.slurm.slurm import SlurmScheduler

    class Queued(SlurmScheduler):
        def status(self, job_id: str) -> JobStatus:
            return JobStatus(job_id, "PENDING", reason="Resources")

        def end_dir(self, job_id: str) -> None:
            return None

    with pytest.raises(WaitTimeout, match=r"slurm:7 still PENDING \(Resources\) after 0s"):
        Queued().wait("7", timeout=0.05, poll=0.01)
    assert JobStatus("7", "RUNNING", reason="None").waiting_on() == "RUNNING"
    assert JobStatus("7", "PENDING", reason="None").waiting_on() == "PENDING"


def test_a_wait_shows_the_jobs_elapsed_once_it_started_and_its_own_seconds_before() -> None:
    """`wait` and `bench sweep` showed the wait's seconds as `elapsed 0s` beside `status`'s elapsed=1.9s."""
    assert JobStatus("7", "COMPLETED", elapsed="1.9s").elapsed_or_waited(0.2) == "elapsed 1.9s"
    assert JobStatus("7", "RUNNING", elapsed="00:00:05").elapsed_or_waited(12) == "elapsed 00:00:05"
    assert JobStatus("7", "PENDING", elapsed="00:00:00").elapsed_or_waited(40.4) == "waited 40s"
    assert JobStatus("7", "RUNNING").elapsed_or_waited(3) == "waited 3s"  # not reported yet
