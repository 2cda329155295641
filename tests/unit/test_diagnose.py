"""The failure verdict from a job's evidence (torchhpc.diagnose.verdict).

The ``exception-*`` and ``abort-*`` cases in tests/data/diagnose are real: slurm.out and the
per-rank files of 2-node x 2-rank jobs on the dev cluster under each launcher (rank 2 raises
ValueError; rank 3 calls os.abort() after its last collective), paths replaced. The CUDA and NCCL
messages in tests/data/diagnose/messages were recorded on an H200 (a real out-of-memory, NCCL's
bootstrap without an interface, two ranks on one GPU, a device index past the last GPU); the
watchdog and rendezvous timeouts are transcribed from torch's formats: see its README.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from torchhpc.diagnose.classify import classify_text, launcher_events
from torchhpc.diagnose.evidence import Evidence
from torchhpc.diagnose.verdict import diagnose
from torchhpc.jobdir.logs import JobLog, rank_files

DATA = Path(__file__).resolve().parents[1] / "data" / "diagnose"
LAUNCHERS = ("srun", "torchrun", "mpirun")


def _evidence(case: str, launcher: str, tmp_path: Path, state: str = "FAILED", code: int = 143) -> Evidence:
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    for f in (DATA / case).glob("rank-*.log"):
        shutil.copy(f, ranks / f.name)
    log = JobLog(output=str(DATA / case / "slurm.out"), ranks_dir=str(ranks), launcher=launcher, nproc_per_node=2)
    files = rank_files(str(ranks))
    return Evidence(
        lines=log.read(final=True), rank_logs={r: p for r, (p, _n) in files.items()},
        nodes={r: n for r, (_p, n) in files.items()}, launcher=launcher, nproc_per_node=2,
        state=state, exit_code=code, job="slurm:7",
    )


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_exception_on_rank_2_is_named_first_and_the_rest_are_consequences(launcher: str, tmp_path: Path) -> None:
    v = diagnose(_evidence(f"exception-{launcher}", launcher, tmp_path))
    assert v.klass == "user-exception"
    assert v.first is not None and v.first.rank == 2 and v.first.host == "node2"
    assert v.first.exit == "exit 1"  # the rank's own status, not the launcher's 143
    assert v.first.error == "ValueError: planted failure on rank 2"
    assert v.first.where.endswith("fail2.py:6")
    assert v.consequences == (0, 1, 3)
    text = v.render()
    assert len(text.splitlines()) <= 8
    assert "rank 2 on node2" in text and "ranks 0-1,3" in text and "--rank 2" in text


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_abort_after_the_last_collective_is_named_with_sigabrt(launcher: str, tmp_path: Path) -> None:
    v = diagnose(_evidence(f"abort-{launcher}", launcher, tmp_path, code=134))
    assert v.klass == "native-crash"
    assert v.first is not None and v.first.rank == 3 and v.first.host == "node2"
    assert v.first.exit == "SIGABRT"


def test_torchrun_root_cause_blocks_order_agents_by_time() -> None:
    texts = (DATA / "exception-torchrun" / "slurm.out").read_text().splitlines()
    events = launcher_events(texts, "torchrun")
    assert events[0][:2] == (2, "node2")  # rank 2 failed first; node1's agent only saw rank 1 die after


@pytest.mark.parametrize(
    ("message", "klass", "error"),
    [
        ("cuda-oom", "cuda-oom", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 9.98 GiB."),
        ("nccl-no-socket-interface", "network", "torch.distributed.DistBackendError: NCCL error"),
        ("nccl-duplicate-gpu", "gpu-assignment", "Duplicate GPU detected : rank 0 and rank 1 both on CUDA device"),
        ("gpu-out-of-range", "gpu-assignment", "ValueError: device_id cuda:1 is out of range."),
        ("nccl-watchdog-timeout", "network", "[Rank 3] Watchdog caught collective operation timeout"),
        ("rendezvous-timeout", "network", "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError"),
        ("import-error", "environment", "ModuleNotFoundError: No module named 'torchvision'"),
        ("thd-two-ranks-one-gpu", "gpu-assignment", "Error: 2 ranks on this node with backend 'nccl' but 1 GPU visible"),
    ],
)
def test_messages_are_classified(message: str, klass: str, error: str) -> None:
    got_class, got_error, _where = classify_text((DATA / "messages" / f"{message}.log").read_text().splitlines())
    assert got_class == klass
    assert error in got_error


def test_user_frame_skips_library_frames() -> None:
    _c, _e, where = classify_text((DATA / "messages" / "cuda-oom.log").read_text().splitlines())
    assert where == "/home/user/torchhpc/benchmarks/gpu_failures.py:39"


@pytest.mark.parametrize(
    ("state", "klass"),
    [("TIMEOUT", "time-limit"), ("OUT_OF_MEMORY", "host-oom"), ("NODE_FAIL", "node-failure"),
     ("PREEMPTED", "preempted"), ("CANCELLED by 0", "cancelled")],
)
def test_the_schedulers_state_explains_every_ranks_death(state: str, klass: str, tmp_path: Path) -> None:
    v = diagnose(_evidence("exception-srun", "srun", tmp_path, state=state))
    assert v.klass == klass
    assert 2 in v.consequences or (v.first is not None and v.first.rank == 2)


def test_time_limit_banner_without_accounting(tmp_path: Path) -> None:
    from torchhpc.jobdir.logs import Line

    banner = "slurmstepd: error: *** JOB 9 ON node1 CANCELLED AT 2026-11-25T13:00:00 DUE TO TIME LIMIT ***"
    v = diagnose(Evidence(lines=[Line(None, banner)], state="", launcher="srun"))
    assert v.klass == "time-limit" and "--time" in v.next_step


def test_completed_job_has_no_failure() -> None:
    v = diagnose(Evidence(state="COMPLETED", exit_code=0))
    assert v.ok and v.render().startswith("diagnosis: no failure")


def test_local_supervisor_reason_names_the_rank() -> None:
    from torchhpc.jobdir.logs import Line

    lines = [Line(None, "rank 1 was killed by signal 6 (SIGABRT); stopped the other 1 ranks"),
             Line(0, "RuntimeError: Connection closed by peer [127.0.0.1]:1")]
    v = diagnose(Evidence(lines=lines, launcher="torchrun", local=True, state="FAILED", exit_code=134))
    assert v.klass == "native-crash" and v.first is not None and v.first.rank == 1 and v.first.exit == "SIGABRT"
    assert v.consequences == (0,)


@pytest.mark.parametrize(("said", "stopped"), [
    ("no other rank was running", ()),
    ("stopped rank 2, still running", (2,)),
    ("stopped ranks 0,3, still running", (0, 3)),
    ("stopped the other 3 ranks", (0, 2, 3)),
])
def test_local_consequences_are_the_ranks_the_supervisor_stopped(said: str, stopped: tuple[int, ...]) -> None:
    """A rank that had ended with 0 before rank 1 failed is no consequence of it (seen: `then ranks 0
    failed as a consequence` after `no other rank was running`)."""
    from torchhpc.jobdir.logs import Line

    reason = f"rank 1 exited with code 3; {said}"
    v = diagnose(Evidence(lines=[Line(None, reason)], local=True, state="FAILED", exit_code=3, nproc_per_node=4,
                          reason=reason))
    assert v.first is not None and v.first.rank == 1 and v.consequences == stopped
    out = v.render()
    if len(stopped) == 1:
        assert f"then rank {stopped[0]} failed as a consequence (lost its peer" in out, out
    elif not stopped:
        assert "consequence" not in out, out


def test_a_rank_with_the_same_error_in_its_own_log_failed_the_same_way() -> None:
    """Two ranks on one GPU (recorded on the H200): each rank's NCCL says "Duplicate GPU detected", so the
    second is no consequence of the first (it said "then rank 0 failed as a consequence (lost its peer, or
    stopped by the launcher)"). A rank that only lost its peer stays a consequence."""
    from torchhpc.jobdir.logs import Line

    lines = []
    for text in (DATA / "messages" / "nccl-duplicate-gpu-two-ranks.log").read_text().splitlines():
        head, _, rest = text.partition("]: ")
        lines.append(Line(int(head[len("[rank"):]), rest))
    reason = "rank 1 exited with code 1; stopped the other rank"
    v = diagnose(Evidence(lines=[Line(None, reason), *lines], launcher="torchrun", local=True, state="FAILED",
                          exit_code=1, nproc_per_node=2, reason=reason, job="local:1"))
    assert v.klass == "gpu-assignment" and v.first is not None and v.first.rank == 1, v
    assert v.alike == (0,) and v.consequences == (), v
    out = v.render()
    assert "rank 0 failed the same way (the same error in its own log)" in out and "consequence" not in out, out
    assert v.to_json()["alike"] == [0]

    peer = [ln for ln in lines if ln.rank == 1] + [Line(0, "RuntimeError: Connection closed by peer [127.0.0.1]:1")]
    v = diagnose(Evidence(lines=[Line(None, reason), *peer], launcher="torchrun", local=True, state="FAILED",
                          exit_code=1, nproc_per_node=2, reason=reason, job="local:1"))
    assert v.alike == () and v.consequences == (0,), v


def test_a_rank_reported_twice_is_one_task_end() -> None:
    """The local supervisor's line and torchrun's Root Cause block both report rank 0 of a 1-rank job: one
    end, not "local reported 2 task ends" (seen on the H200 for every 1-rank failure)."""
    from torchhpc.jobdir.logs import Line

    reason = "rank 0 exited with code 1; no other rank was running"
    root = ["Root Cause (first observed failure):", "[0]:", "  time      : 2026-11-30_00:08:40", "  host      : vm",
            "  rank      : 0 (local_rank: 0)", "  exitcode  : 1 (pid: 4242)", "  error_file: <N/A>"]
    lines = [Line(0, "ValueError: bad config"), *(Line(None, t) for t in root), Line(None, reason)]
    v = diagnose(Evidence(lines=lines, launcher="torchrun", local=True, state="FAILED", exit_code=1,
                          nproc_per_node=1, reason=reason))
    assert v.first is not None and v.first.rank == 0 and v.consequences == () and v.alike == ()
    assert v.evidence[-1] == "the local run saw 1 rank's end", v.evidence


def test_stopped_words_read_back() -> None:
    from torchhpc.core.processes import stopped_ranks, stopped_words

    for stopped in ([], [2], [0, 3], [0, 2, 3]):
        reason = f"rank 1 was killed by signal 9 (SIGKILL); {stopped_words(stopped, 4)}"
        assert stopped_ranks(reason, 4) == set(stopped), reason
    assert stopped_words([0], 2) == "stopped the other rank"
    assert stopped_ranks("interrupted by SIGINT; stopped 2 running ranks of 2", 2) is None  # not a rank's failure
    assert stopped_ranks("", 2) is None


def test_json_has_the_same_verdict(tmp_path: Path) -> None:
    d = diagnose(_evidence("exception-mpirun", "mpirun", tmp_path)).to_json()
    assert d["class"] == "user-exception" and d["first"]["rank"] == 2 and d["first"]["class"] == "user-exception"


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_the_dumps_of_the_others_never_hide_an_abort(launcher: str, tmp_path: Path) -> None:
    """Rank 3 aborts (no dump: no atexit after SIGABRT); the others exit with their group up and leave
    ``.left`` dumps. The crash's own verdict stands: a rank without a dump proves nothing (seen in CI:
    the Flight Recorder's 'wrote no dump' line had replaced 'rank 3 ..., SIGABRT')."""
    from dataclasses import replace

    from torchhpc.diagnose.flight import Finding

    ev = _evidence(f"abort-{launcher}", launcher, tmp_path, code=134)
    gone = Finding("no-dump", "0", 4, "all_reduce", (3,), (0, 1, 2), 0.0, "its process is gone")
    v = diagnose(replace(ev, flight=(gone,)))
    assert v.klass == "native-crash" and v.first is not None and (v.first.rank, v.first.exit) == (3, "SIGABRT")
    left = Finding("left", "0", 4, "all_reduce", (3,), (0, 1, 2))
    v = diagnose(replace(ev, flight=(left,)))
    assert v.klass == "native-crash" and v.first is not None and v.first.exit == "SIGABRT"
