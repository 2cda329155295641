"""The local restart loop's pure parts (supervisor/restarts.py); the runs themselves are
tests/integration/test_local_restarts.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchhpc.core.spec import Entrypoint, JobSpec
from torchhpc.errors import JobFailed, SpecError
from torchhpc.schedulers import get_scheduler
from torchhpc.supervisor import load_attempts
from torchhpc.supervisor.restarts import Restarts, classify_log


def test_classify_reads_only_the_attempt_and_names_the_first_rank_with_a_cause(tmp_path: Path) -> None:
    log = tmp_path / "output.log"
    old = "[rank0]: Traceback (most recent call last):\n[rank0]: ValueError: the first attempt's\n"
    log.write_text(old + "[rank1]: RuntimeError: Connection reset by peer\n"
                   "[rank2]: Traceback (most recent call last):\n[rank2]:   File \"t.py\", line 3, in <module>\n"
                   "[rank2]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
                   "torchhpc: a line of torchhpc's own\n")
    assert classify_log(str(log), 0)[:2] == ("user-exception", 0)  # the first attempt's exception comes first
    klass, rank, error = classify_log(str(log), len(old))  # this attempt: rank 1 only lost its peer
    assert (klass, rank) == ("cuda-oom", 2) and "CUDA out of memory" in error
    log.write_text(old + "[rank1]: RuntimeError: Connection reset by peer\n")
    assert classify_log(str(log), len(old)) == ("lost-peer", None, "")
    assert classify_log(str(tmp_path / "none.log"), 0) == ("unknown", None, "")


def test_the_loop_restarts_by_policy_and_records_each_attempt(tmp_path: Path) -> None:
    log = tmp_path / "output.log"
    log.write_text("")
    said: list[str] = []
    lines = ["[rank1]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer\n",
             "[rank0]: Traceback (most recent call last):\n[rank0]: ValueError: bad\n"]

    def attempt(count: int) -> int:
        with open(log, "a") as f:
            f.write(lines[count])
        raise JobFailed(f"rank {1 - count} exited with code 1", returncode=1)

    with pytest.raises(JobFailed):
        Restarts(max_restarts=5, job_dir=str(tmp_path), log_path=str(log), say=said.append).run(attempt)
    got = [(a["attempt"], a["class"]) for a in load_attempts(str(tmp_path))]
    assert got[1] == (1, "user-exception") and got[0][1] in ("network", "lost-peer"), got
    assert said[-1].startswith("not restarting after user-exception"), said


def test_without_restarts_nothing_is_recorded_and_a_cancel_is_final(tmp_path: Path) -> None:
    calls: list[int] = []

    def attempt(count: int) -> int:
        calls.append(count)
        raise JobFailed("interrupted by SIGTERM; stopped 2 running rank(s) of 2", returncode=143)

    for n in (0, 3):
        with pytest.raises(JobFailed):
            Restarts(max_restarts=n, job_dir=str(tmp_path), log_path=str(tmp_path / "x.log"), say=print).run(attempt)
    assert calls == [0, 0] and load_attempts(str(tmp_path)) == []


def test_a_local_array_refuses_max_restarts() -> None:
    spec = JobSpec(entrypoint=Entrypoint.parse(["examples/pi.py"]), scheduler="local", max_restarts=1,
                   array="0-1")  # type: ignore[arg-type]
    with pytest.raises(SpecError, match="separate runs"):
        get_scheduler("local").render(spec)


def test_on_hang_requeue_is_refused_where_the_job_watches_itself(capsys: pytest.CaptureFixture[str]) -> None:
    from torchhpc.cli.main import main

    base = ["run", "--scheduler", "slurm", "--nodes", "2", "--hang-timeout", "60", "--on-hang", "requeue", "--dry-run"]
    assert main([*base, "--max-restarts", "1", "examples/pi.py"]) == 2  # the supervisor restarts; no client requeues
    err = capsys.readouterr().err
    assert "watches itself for hangs" in err and "HINT:" in err and "Traceback" not in err
    assert main([*base, "examples/pi.py"]) == 0  # unsupervised: `wait --hang-timeout` requeues it
    assert main(["run", "-n", "2", "--background", "--hang-timeout", "60", "--on-hang", "requeue", "--dry-run",
                 "examples/pi.py"]) == 2
    assert "cannot requeue" in capsys.readouterr().err


def test_a_restart_storm_ends_attempts_json_with_no_progress(tmp_path: Path) -> None:
    """Every attempt hangs before a checkpoint: after the third, the job ends with no-progress, and so
    does attempts.json (it said hang, hang, hang); the verdict then says no-progress too."""
    from torchhpc.diagnose.evidence import Evidence
    from torchhpc.diagnose.verdict import diagnose

    log = tmp_path / "output.log"
    log.write_text("")
    said: list[str] = []

    def attempt(count: int) -> int:
        with open(log, "a") as f:
            f.write("[rank1]: RuntimeError: Connection closed by peer\n")
        raise JobFailed("rank 1 exited with code 1", returncode=1)

    r = Restarts(max_restarts=5, job_dir=str(tmp_path), log_path=str(log), say=said.append,
                 checkpoint_dir=str(tmp_path / "ckpt"))
    with pytest.raises(JobFailed):
        r.run(attempt)
    tries = load_attempts(str(tmp_path))
    assert [(a["class"], a.get("cause")) for a in tries] == [("lost-peer", None)] * 2 + [("no-progress", "lost-peer")]
    assert r.klass == "no-progress" and r.exit_code(1) == 84
    v = diagnose(Evidence(attempts=tries, job="local:x"))
    assert v.klass == "no-progress" and v.summary == "restart storm: lost-peer x3 before the first checkpoint, no checkpoint advance"
    assert v.render().startswith("diagnosis: no-progress — restart storm: lost-peer x3"), v.render()
