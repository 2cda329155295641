"""torchhpc.dist.stop: the stop file, SIGTERM as a request, and one agreed answer for every rank."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from tests.conftest import need, reaped
from torchhpc.dist import stop


@pytest.fixture(autouse=True)
def fresh_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stop, "_flag", threading.Event())
    monkeypatch.delenv("TORCHHPC_STOP_FILE", raising=False)


def test_stop_file_is_seen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / ".torchhpc-stop-42"
    monkeypatch.setenv("TORCHHPC_STOP_FILE", str(f))
    assert stop.stop_requested_locally() is False
    f.touch()
    assert stop.stop_requested_locally() is True


def test_should_stop_says_a_rank_took_the_stop_only_when_it_answers_true(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "stop"
    monkeypatch.setenv("TORCHHPC_STOP_FILE", str(f))
    assert stop.should_stop() is False and not (tmp_path / "stop.taken").exists()
    f.touch()
    assert stop.should_stop(every=5, step=3) is False and not (tmp_path / "stop.taken").exists()  # not asked here
    assert stop.should_stop() is True and (tmp_path / "stop.taken").exists()


def test_request_stop_sets_the_flag() -> None:
    assert stop.stop_requested_locally() is False
    stop.request_stop("test")
    assert stop.stop_requested_locally() is True


def test_should_stop_alone_and_every_n(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    need("torch")
    monkeypatch.setattr(stop, "watch", lambda *a, **k: None)  # keep pytest's own SIGTERM handling
    assert stop.should_stop() is False
    stop.request_stop()
    assert stop.should_stop() is True
    assert stop.should_stop(every=5, step=3) is False  # not a synchronisation step
    assert stop.should_stop(every=5, step=10) is True


SIGTERM_CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from torchhpc.dist import stop
    stop.watch()
    os.kill(os.getpid(), signal.SIGTERM)   # preemption / torchrun shutting its workers down
    print("alive", stop.stop_requested_locally())
    """
)


def test_sigterm_becomes_a_stop_request_not_death() -> None:
    r = subprocess.run([sys.executable, "-c", SIGTERM_CHILD], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "alive True"


RANK = textwrap.dedent(
    """
    import sys, torch.distributed as dist
    from torchhpc.dist import stop
    rank, store_path = int(sys.argv[1]), sys.argv[2]
    dist.init_process_group("gloo", store=dist.FileStore(store_path, 2), rank=rank, world_size=2)
    answers = []
    for step in range(1, 7):
        if rank == 1 and step == 4:
            stop.request_stop("only rank 1 was asked")
        answers.append(stop.should_stop())
        if answers[-1]:
            break
    print(rank, step, answers, flush=True)
    dist.destroy_process_group()
    """
)


def test_all_ranks_stop_at_the_same_step(tmp_path: Path) -> None:
    """Two real gloo ranks (FileStore, no ports); only rank 1 sees the request, both stop at step 4."""
    need("torch")
    store = str(tmp_path / "store")
    ranks = [
        subprocess.Popen([sys.executable, "-c", RANK, str(r), store], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for r in (0, 1)
    ]
    with reaped(ranks):
        outs = [p.communicate(timeout=120) for p in ranks]
    for p, (_o, e) in zip(ranks, outs):
        assert p.returncode == 0, e
    assert outs[0][0].strip() == "0 4 [False, False, False, True]"
    assert outs[1][0].strip() == "1 4 [False, False, False, True]"


# The batch-shell half: the rendered sbatch script under a real bash, with stub Slurm commands.
STUBS = {
    # hostnames: mark that the script is past its traps, then take a moment (a warning may land here)
    "scontrol": 'case "$1 $2" in "show hostnames") touch "$STUB_DIR/at-hostnames"; sleep 0.5; echo node1;;'
    ' "show job") echo "JobId=$SLURM_JOB_ID JobState=${STUB_STATE:-RUNNING} Restarts=0";;'
    ' *) echo "$*" >> "$STUB_DIR/scontrol.log";; esac',
    "getent": "echo '10.0.0.1 STREAM node1'",
    "ss": "exit 0",
    # the job step: runs until every rank would have seen the stop file, takes it (should_stop's .taken: not
    # with $STEP_NO_TAKE, a step whose work was done), then exits with $STEP_RC
    "srun": 'echo $$ > "$STUB_DIR/step.pid"; touch "$STUB_DIR/step-started"; [ -n "${STEP_PREEMPTED:-}" ] && touch "$TORCHHPC_STOP_FILE";'
    ' for _ in $(seq 200); do [ -e "$TORCHHPC_STOP_FILE" ] && { [ -n "${STEP_NO_TAKE:-}" ] || touch "$TORCHHPC_STOP_FILE.taken"; break; };'
    ' [ -n "${STEP_QUICK:-}" ] && break; sleep 0.05; done; exit "${STEP_RC:-0}"',
}


def _run_script(tmp_path: Path, sig: str | None, *, when: str = "step-started", rc: int = 0, timeouts: int = 0,
                quick: bool = False, extra_env: dict[str, str] | None = None,
                extra_stubs: dict[str, str] | None = None,
                spec_env: tuple[tuple[str, str], ...] = ()) -> tuple[int, str, str]:
    import os
    import signal as signals
    import time

    from torchhpc.core.spec import Entrypoint, JobSpec
    from torchhpc.schedulers.batch.script import job_boot
    from torchhpc.schedulers.slurm.slurm import SlurmScheduler

    out, stubs = tmp_path / "out", tmp_path / "bin"
    out.mkdir()
    stubs.mkdir()
    for name, body in {**STUBS, **(extra_stubs or {})}.items():
        (stubs / name).write_text(f"#!/bin/bash\n{body}\n")
        (stubs / name).chmod(0o755)
    spec = JobSpec(
        entrypoint=Entrypoint.parse(["train.py"], python="python3"), nodes=1, nproc_per_node=1, scheduler="slurm",
        launcher="srun", name="t", output_dir=str(out), time="00:10:00", requeue=True, signal_before=120,
        max_timeout_requeues=1, env=spec_env,
    )
    script = tmp_path / "job.sbatch"
    script.write_text(SlurmScheduler(runner=None).render_script(spec))  # type: ignore[arg-type]
    for path, text in job_boot(spec)[1]:  # the boot copy the submit writes (python3 is not this interpreter)
        Path(path).parent.mkdir(exist_ok=True)
        Path(path).write_text(text)
    if timeouts:
        (out / ".torchhpc-timeouts-123").write_text(f"{timeouts}\n")
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "STUB_DIR": str(tmp_path), "SLURM_JOB_ID": "123",
           "SLURM_JOB_NODELIST": "node1", "STEP_RC": str(rc), **({"STEP_QUICK": "1"} if quick else {}), **(extra_env or {})}
    shell = subprocess.Popen(["bash", str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if sig:
        deadline = time.monotonic() + 30
        while not (tmp_path / when).exists():
            assert shell.poll() is None and time.monotonic() < deadline, shell.communicate()
            time.sleep(0.01)
        shell.send_signal(getattr(signals, sig))
    stdout, stderr = shell.communicate(timeout=60)
    log = tmp_path / "scontrol.log"
    return shell.returncode, stdout + stderr, log.read_text() if log.exists() else ""


def test_warning_creates_the_stop_file_and_requeues(tmp_path: Path) -> None:
    rc, text, requeues = _run_script(tmp_path, "SIGUSR2")
    assert rc == 0, text
    assert "time-limit at" in text and "requeuing job 123" in text, text
    assert requeues == "requeue 123\n"
    assert (tmp_path / "out" / ".torchhpc-timeouts-123").read_text().strip() == "1"


def test_a_step_whose_work_was_done_before_the_warning_is_not_requeued(tmp_path: Path) -> None:
    """Run K: a resumed attempt finished its last step 60 ms before the time-limit warning reached the batch
    shell; no rank took the stop, the step ended 0, and the job was requeued and did its last 34 steps
    again. A step that ends 0 with no rank's ``.taken`` beside the stop file is done: no requeue."""
    rc, text, requeues = _run_script(tmp_path, "SIGUSR2", extra_env={"STEP_NO_TAKE": "1"})
    assert rc == 0 and requeues == "", text
    assert "the step ended 0 before any rank took the time-limit stop" in text, text
    assert not (tmp_path / "out" / ".torchhpc-timeouts-123").exists(), "a requeue not made was counted"


def test_a_step_that_fails_after_a_warning_nobody_took_is_still_requeued(tmp_path: Path) -> None:
    """Only a clean end says the work was done: a step that dies (the time limit's SIGKILL, a crash) goes on
    from its last checkpoint, as before."""
    _rc, text, requeues = _run_script(tmp_path, "SIGUSR2", extra_env={"STEP_NO_TAKE": "1", "STEP_RC": "137"})
    assert "step exited 137 after the time-limit stop" in text and requeues == "requeue 123\n", text


def test_a_step_that_ends_while_the_trap_runs_keeps_its_exit_status(tmp_path: Path) -> None:
    """Issue 12's race, made deterministic: the trap's ``touch`` of the stop file returns only after
    the step has seen the file, exited 0 and been reaped by the batch shell. So the step is gone
    before the shell looks at it again; the old ``wait || _rc=$?; while kill -0 ...`` block then
    kept wait's 128+USR2 and the job "failed" with 140 although every rank left cleanly."""
    import shutil

    real_touch = shutil.which("touch")
    assert real_touch
    touch = (
        f'{real_touch} "$@"\n'
        '[ "$1" = -- ] && [ "$2" = "$TORCHHPC_STOP_FILE" ] || exit 0\n'
        '# the trap handler is touching the stop file: hold it until the step has ended and been reaped\n'
        'while kill -0 "$(cat "$STUB_DIR/step.pid")" 2>/dev/null; do sleep 0.01; done\n'
        'touch "$STUB_DIR/step-gone-before-trap-returned"'
    )
    rc, text, requeues = _run_script(tmp_path, "SIGUSR2", extra_stubs={"touch": touch})
    assert (tmp_path / "step-gone-before-trap-returned").exists(), text
    assert rc == 0, text
    assert "step exited 0 after the time-limit stop" in text and requeues == "requeue 123\n", text


def test_a_step_killed_by_a_signal_keeps_its_status_after_a_warning(tmp_path: Path) -> None:
    """A wait cut short by the trap is 128+12; the step's own death by SIGKILL (137) must still be
    reported as 137, not as the trap's status."""
    _rc, text, _ = _run_script(tmp_path, "SIGUSR2", extra_env={"STEP_RC": "137"})
    assert "step exited 137 after the time-limit stop" in text, text


def test_the_scripts_own_variables_never_clobber_the_users(tmp_path: Path) -> None:
    """The batch shell's variables carry the reserved _torchhpc_ prefix: a user's --env _hosts=...
    (or any other name the script once used for itself) reaches the ranks unchanged."""
    names = ("_hosts", "_try", "_stop_reason", "_timeouts_file", "_step", "_rc", "MASTER_HOST")
    env = tuple((n, f"user{i}") for i, n in enumerate(names))
    show = "".join(f"${{{n}}} " for n in names)
    rc, text, _ = _run_script(tmp_path, None, spec_env=env, extra_stubs={"srun": f'echo "ranks see: {show}"'})
    assert rc == 0, text
    assert "ranks see: " + "".join(f"user{i} " for i in range(len(names))) in text, text


def test_a_warning_before_the_step_starts_is_not_lost(tmp_path: Path) -> None:
    """Slurm may warn up to a minute early: the trap is set before anything else runs."""
    rc, text, requeues = _run_script(tmp_path, "SIGUSR2", when="at-hostnames")
    assert rc == 0, text
    assert requeues == "requeue 123\n", text


def test_time_limit_requeues_are_capped_and_unfinished_work_ends_85(tmp_path: Path) -> None:
    """Issue 70: the ranks took the stop, the step ended 0 and --max-requeues was used up: the work is
    unfinished, so the job ends 85 (time-limit), never COMPLETED 0 (``--after-ok`` would go on)."""
    rc, text, requeues = _run_script(tmp_path, "SIGUSR2", timeouts=1)
    assert requeues == "" and "not requeuing: --max-requeues 1 used up" in text, text
    assert rc == 85 and "its work is unfinished (exit 85, time-limit)" in text, text
    # the job has ended: its stop file, a rank's word that it took it and its count are gone (one directory per job)
    assert sorted(p.name for p in (tmp_path / "out").iterdir() if p.name.startswith((".torchhpc-stop", ".torchhpc-timeouts"))) == [], text


def test_preemption_requeues_uncapped_even_when_the_step_exits_nonzero(tmp_path: Path) -> None:
    """Preemption's grace-time SIGTERM reaches the ranks only; a rank creates the stop file and
    torchrun exits 1 although its workers checkpointed: the shell still requeues, uncapped."""
    rc, text, requeues = _run_script(tmp_path, None, timeouts=1, rc=1, extra_env={"STEP_PREEMPTED": "1"})
    assert rc == 1
    assert "after the preempted stop" in text and requeues == "requeue 123\n", text


def test_sigterm_to_the_batch_shell_never_requeues(tmp_path: Path) -> None:
    """SIGTERM to the batch shell is Slurm ending the job (scancel, hard limit): a cancel must stick."""
    _rc, text, requeues = _run_script(tmp_path, "SIGTERM")
    assert requeues == "" and "not requeuing from here" in text, text


def test_a_job_that_is_no_longer_running_is_not_requeued(tmp_path: Path) -> None:
    _rc, text, requeues = _run_script(tmp_path, "SIGUSR2", extra_env={"STUB_STATE": "CANCELLED"})
    assert requeues == "" and "not requeuing: JobState=CANCELLED" in text, text


def test_no_stop_no_requeue(tmp_path: Path) -> None:
    rc, text, requeues = _run_script(tmp_path, None, quick=True, rc=3)
    assert rc == 3 and requeues == "", text


def test_sigterm_creates_the_stop_file_for_the_others(tmp_path: Path) -> None:
    f = tmp_path / ".torchhpc-stop-7"
    child = SIGTERM_CHILD.replace("stop.watch()", f"os.environ['TORCHHPC_STOP_FILE'] = {str(f)!r}; stop.watch()")
    r = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "alive True", r.stderr
    assert f.exists()
