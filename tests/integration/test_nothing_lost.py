"""Nothing lost: time limits, preemption, rank death, node failure, torn checkpoints, shared nodes.

Every scenario runs for real on the dev cluster (slurmctld + slurmd in network
namespaces, ranks talking gloo over veth): a 2-node torchrun job of
``scripts/ckpt_train.py`` (a small deterministic DDP model) is interrupted the
way users' jobs are, and the final parameters are compared bit for bit
(``torch.equal``) with an uninterrupted run of the same world size. Each
scenario prints a ``NOTHING-LOST`` line with the time from the fault to every
process gone / to the resumed run, and the steps lost (run ``pytest -s`` to see them).

A requeued job is held by Slurm for its credential lifetime (120 s by default,
``AuthInfo=cred_expire``) before it may start again, so the requeue scenarios
each take a little over two minutes.

The link-down scenario and the two jobs on one node (which need all four of node3's CPUs) run on a
4-node cluster of the module's own (``own_cluster``, tests/integration/conftest.py), beside the
shared one's tests, not alone on it.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.cli_run import torchhpc
from tests.conftest import REPO
from tests.integration.conftest import SlurmClient

pytestmark = pytest.mark.cluster("slurm")

TRAIN = str(REPO / "tests" / "integration" / "scripts" / "ckpt_train.py")
STEPS = 60
GONE_WITHIN = 30.0  # the fail-fast bound, seconds

_EVENT = re.compile(r"\b(START|STOPPED|DONE) step=(\d+)\b.*?restart=(\d+) t=([\d.]+)")
_STEP = re.compile(r"\bstep (\d+) restart=(\d+) t=([\d.]+)")


# helpers ----------------------------------------------------------------------


def submit(cluster: Any, out: Path, name: str, flags: list[str], train: list[str], launcher: str = "torchrun",
           env: dict[str, str] | None = None) -> str:
    """``torchhpc run --scheduler slurm`` of ckpt_train.py (``env``: more of the submitting environment); the job id."""
    out.mkdir(parents=True, exist_ok=True)
    r = torchhpc(
        {**cluster.client_env(), **env} if env else cluster, "run", "--scheduler", "slurm", "--launcher", launcher, "--name", name,
        "--output-dir", str(out), *flags, TRAIN, "--ckpt", str(out / "ckpt"), "--out", str(out / "final.pt"),
        *train, cwd=out,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r"Submitted slurm:(\d+)", r.stdout)
    assert m, r.stdout
    return m.group(1)


def log_of(out: Path, name: str, job: str) -> str:
    """The job's whole output: the batch shell's ``slurm.out`` then every rank's own file.

    Each job has one directory, ``<output-dir>/<name>-<id>/`` (docs/logs.md); a requeued job
    keeps it and its files are appended to. Events carry their own time stamps, so the order
    of the files does not matter to :func:`events`."""
    job_dir = out / f"{name}-{job}"
    paths = [job_dir / "slurm.out", *sorted((job_dir / "ranks").glob("rank-*.log"))]
    return "".join(p.read_text(errors="replace") for p in paths if p.exists())


def events(text: str) -> list[tuple[str, int, int, float]]:
    """(kind, step, restart, time) for START/STOPPED/DONE and per-step lines of rank 0."""
    out = [(m.group(1), int(m.group(2)), int(m.group(3)), float(m.group(4))) for m in _EVENT.finditer(text)]
    out += [("step", int(m.group(1)), int(m.group(2)), float(m.group(3))) for m in _STEP.finditer(text)]
    return sorted(out, key=lambda e: e[3])


def steps_lost(text: str) -> tuple[int, int]:
    """(skipped, repeated) optimizer steps over every restart.

    Each attempt must START exactly at the last step the previous attempt
    reached: a later start skipped steps, an earlier one redoes them.
    """
    skipped = repeated = reached = 0
    for kind, step, _restart, _t in events(text):
        if kind == "START":
            skipped += max(0, step - reached)
            repeated += max(0, reached - step)
            reached = step
        else:
            reached = max(reached, step)
    return skipped, repeated


def wait_until(pred: Callable[[], Any], timeout: float, what: str, every: float = 0.25) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


def procs(marker: str) -> list[tuple[int, str]]:
    """Processes whose command line names ``marker`` (the nodes share the host's PID namespace)."""
    out = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout
    me = os.getpid()
    pids = [int(p) for p in out.split() if p.isdigit() and int(p) != me]
    found = []
    for pid in pids:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and "pgrep" not in cmd:
            found.append((pid, cmd))
    return found


def wait_gone(marker: str, timeout: float) -> float:
    """Seconds until no process names ``marker`` (fails after ``timeout``); the monotonic time it happened."""
    wait_until(lambda: not procs(marker), timeout, f"every process of {marker} to exit")
    return time.time()


def wait_job(slurm: SlurmClient, job: str, timeout: float) -> dict[str, str]:
    return slurm.wait(job, timeout=timeout)


def final_params(path: Path) -> dict[str, Any]:
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)  # type: ignore[no-any-return]


def assert_bit_identical(got: Path, ref: Path) -> None:
    import torch

    a, b = final_params(got), final_params(ref)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"parameter {k} differs from the uninterrupted run"


def report(scenario: str, **figures: Any) -> None:
    text = " ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in figures.items())
    print(f"\nNOTHING-LOST {scenario}: {text}", flush=True)


# the uninterrupted reference ----------------------------------------------------
@pytest.fixture(scope="module")
def reference(slurm_cluster: Any, slurm: SlurmClient, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Final parameters of an uninterrupted 2-node, 2-rank run (same world size as the scenarios)."""
    out = tmp_path_factory.mktemp("nl-reference")
    job = submit(slurm_cluster, out, "ref", ["-N", "2", "--nproc-per-node", "1"], ["--steps", str(STEPS)])
    info = wait_job(slurm, job, 240)
    assert info["JobState"] == "COMPLETED", log_of(out, "ref", job)
    assert (out / "final.pt").exists()
    return out / "final.pt"


def _attempts(text: str) -> dict[int, list[tuple[str, int, int, float]]]:
    by: dict[int, list[tuple[str, int, int, float]]] = {}
    for e in events(text):
        by.setdefault(e[2], []).append(e)
    return by


def check_resumed_run(text: str, min_restarts: int = 1) -> tuple[int, int, float]:
    """A requeued run stopped on a step boundary, resumed at exactly that step and finished.

    Returns (steps lost, steps repeated, seconds from the first STOPPED to the next START).
    """
    by = _attempts(text)
    assert len(by) >= 1 + min_restarts, f"expected a requeued attempt:\n{text}"
    stops = [e for e in events(text) if e[0] == "STOPPED"]
    assert stops, f"no rank stopped on the stop request:\n{text}"
    done = [e for e in events(text) if e[0] == "DONE"]
    assert done and done[-1][1] == STEPS, f"the run did not finish:\n{text}"
    lost, repeated = steps_lost(text)
    first_stop = stops[0]
    resumed = next(e for e in events(text) if e[0] == "START" and e[2] > first_stop[2])
    assert resumed[1] == first_stop[1], f"resumed at {resumed[1]}, stopped at {first_stop[1]}"
    return lost, repeated, resumed[3] - first_stop[3]


def _clock(text: str, pattern: str) -> float | None:
    """Epoch seconds of the batch shell's ``torchhpc: <reason> at HH:MM:SS`` line (today, local time)."""
    m = re.search(pattern + r" at (\d\d):(\d\d):(\d\d)", text)
    if not m:
        return None
    now = time.localtime()
    return time.mktime((now.tm_year, now.tm_mon, now.tm_mday, int(m.group(1)), int(m.group(2)), int(m.group(3)), 0, 0, -1))


# 1. time limit ----------------------------------------------------------------
LAUNCHERS = ("torchrun", "srun", "mpirun")


# Three 2-node jobs at once, each with a 1-minute limit whose warning Slurm may send up to a minute early:
# the ranks must start, stop and leave well inside it. Beside four other rank-starting tests (load 28 on
# 2 cores, run Y in docs/testing.md), torchrun's ranks started 52 s into an attempt and its agents took over 8 s to leave
# after their workers' checkpoint, so the limit ended the job (TIMEOUT); in run X five attempts made one
# step each. Holding every slot but one keeps its starts within the limit.
@pytest.mark.whole_machine
def test_time_limit_checkpoints_requeues_and_resumes_bit_identical(
    slurm_cluster: Any, slurm: SlurmClient, reference: Path, tmp_path: Path
) -> None:
    """--time 1 with --signal-before 10 --requeue, under each launcher (the three jobs side by side):
    USR2 reaches only the batch shell, which relays it through the stop file; the ranks (torchrun's
    workers, srun's tasks, mpirun's processes) agree on the step, checkpoint, exit 0; the shell
    requeues; the next attempt (fast) resumes and finishes, bit for bit."""
    jobs = {
        launcher: submit(
            slurm_cluster, tmp_path / launcher, "tl", ["-N", "2", "--nproc-per-node", "1", "--time", "1", "--signal-before", "10",
                                                       "--requeue", "--max-requeues", "5"],
            ["--steps", str(STEPS), "--sleep", "1.0", "--sleep-first-attempt-only"], launcher=launcher,
        )
        for launcher in LAUNCHERS
    }
    ended = slurm.wait_all(list(jobs.values()), 900)
    infos = {launcher: ended[job] for launcher, job in jobs.items()}
    for launcher, job in jobs.items():
        out = tmp_path / launcher
        info = infos[launcher]
        text = log_of(out, "tl", job)
        assert info["JobState"] == "COMPLETED", f"{launcher}: {text}"
        assert "STOPPED" in text, f"{launcher}: the ranks never stopped before the time limit:\n{text}"
        assert "torchhpc: time-limit at" in text and "requeuing job" in text, f"{launcher}: {text}"
        assert int(info.get("Restarts", "0")) >= 1, f"{launcher}: {info}"
        lost, repeated, to_resume = check_resumed_run(text)
        assert (lost, repeated) == (0, 0), launcher
        assert_bit_identical(out / "final.pt", reference)
        st = torchhpc(slurm_cluster, "status", f"slurm:{job}", "--json", cwd=out)
        assert '"restarts": ' in st.stdout and '"restarts": 0' not in st.stdout, st.stdout
        t_fault = _clock(text, "torchhpc: time-limit")
        assert t_fault is not None, launcher
        stop = next(e for e in events(text) if e[0] == "STOPPED")
        report(
            f"time-limit ({launcher})", signal_to_checkpointed_s=stop[3] - t_fault,
            signal_to_resumed_s=stop[3] - t_fault + to_resume, restarts=info.get("Restarts"), steps_lost=lost,
            steps_repeated=repeated,
        )


# 2. preemption-style interruptions ------------------------------------------------
INTERRUPTIONS = {
    # Preemption with a grace time (PreemptMode=CANCEL/REQUEUE + GraceTime): Slurm sends SIGTERM
    # to the ranks' steps only, not to the batch shell; a rank creates the stop file, the shell requeues.
    "scancel-term": lambda job: ["scancel", "--signal=TERM", job],
    # What a time limit does, on demand: USR2 to the batch shell only (relayed by the stop file).
    "scancel-usr2-batch": lambda job: ["scancel", "--batch", "--signal=USR2", job],
    # Slurm ends the job itself (SIGTERM to every process, srun included, which answers with
    # SIGKILL to its tasks) and requeues it: the ranks race srun to their checkpoint.
    "scontrol-requeue": lambda job: ["scontrol", "requeue", job],
}
# Only where Slurm itself kills the step can a checkpoint lose the race (then the run resumes
# from the periodic one, every 5 steps): reported, not asserted.
EXACT = {"scancel-term", "scancel-usr2-batch"}


def test_preemption_style_interruptions_resume_bit_identical(
    slurm_cluster: Any, slurm: SlurmClient, reference: Path, tmp_path: Path
) -> None:
    """The three ways a running job is interrupted from outside, run side by side (each job
    waits out Slurm's requeue hold once): each checkpoints at a step boundary, is requeued,
    resumes at that step and ends with the reference's parameters bit for bit."""
    jobs: dict[str, str] = {}
    for name in INTERRUPTIONS:
        jobs[name] = submit(
            slurm_cluster, tmp_path / name, name, ["-N", "2", "--nproc-per-node", "1", "--requeue"],
            ["--steps", str(STEPS), "--sleep", "0.5", "--sleep-first-attempt-only", "--ckpt-every", "5"],
        )
    t_fault: dict[str, float] = {}
    pending = dict(jobs)
    # 180 s to make progress from each job's start: side by side, another test's jobs (the compatibility
    # matrix's columns) may hold the CPUs for minutes first, and a job's wait in the queue is not this test's
    # subject (run G: one job of three was still pending at 180 s)
    submitted, looked, started = time.monotonic(), 0.0, {}  # started: name -> when squeue first said RUNNING
    while pending:  # interrupt each job once its first attempt has made progress
        for name, job in list(pending.items()):
            ev = events(log_of(tmp_path / name, name, job))
            if any(e[0] == "step" and e[1] >= 5 for e in ev):
                t_fault[name] = time.time()
                slurm.run(INTERRUPTIONS[name](job))
                del pending[name]
        if time.monotonic() - looked > 2:  # which of the rest have started (one squeue every 2 s)
            looked = time.monotonic()
            states = slurm.run(["squeue", "-h", "-j", ",".join(pending.values()) or "0", "-o", "%i %T"],
                               timeout=30, check=False).stdout.split()
            running = {i for i, t in zip(states[::2], states[1::2]) if t == "RUNNING"}
            started.update({n: looked for n, j in pending.items() if j in running and n not in started})
        now = time.monotonic()
        late = {n: j for n, j in pending.items()
                if (n in started and now - started[n] > 180) or (n not in started and now - submitted > 600)}
        assert not late, f"jobs never made progress: {late} (running since {started})"
        time.sleep(0.2)
    t_gone: dict[str, float] = {}
    deadline = time.monotonic() + 90
    while len(t_gone) < len(jobs):  # the first attempts' processes leave (the requeued ones start >2 min later)
        for name in jobs:
            if name not in t_gone and not procs(str(tmp_path / name / "ckpt")):
                t_gone[name] = time.time()
        assert time.monotonic() < deadline, f"processes left after the interruption: {set(jobs) - set(t_gone)}"
        time.sleep(0.25)
    ended = slurm.wait_all(list(jobs.values()), 600)
    for name, job in jobs.items():
        info = ended[job]
        text = log_of(tmp_path / name, name, job)
        assert info["JobState"] == "COMPLETED", text
        assert int(info.get("Restarts", "0")) >= 1, info
        lost, repeated = steps_lost(text)
        assert lost == 0, text
        if name in EXACT:
            check_resumed_run(text)
            assert repeated == 0, text
        assert_bit_identical(tmp_path / name / "final.pt", reference)
        stop = next((e for e in events(text) if e[0] == "STOPPED"), None)
        resumed = next(e for e in events(text) if e[0] == "START" and e[2] >= 1)
        report(
            name, fault_to_checkpointed_s=(stop[3] - t_fault[name]) if stop else "lost-the-race",
            fault_to_all_gone_s=t_gone[name] - t_fault[name], fault_to_resumed_s=resumed[3] - t_fault[name],
            steps_lost=lost, steps_repeated=repeated,
        )


def test_scancel_of_a_requeue_job_sticks(slurm_cluster: Any, slurm: SlurmClient, tmp_path: Path) -> None:
    """A user's ``scancel`` ends a --requeue job for good (the batch shell's TERM is not a preemption)."""
    job = submit(slurm_cluster, tmp_path, "cancel", ["-N", "2", "--nproc-per-node", "1", "--requeue"], ["--steps", "400", "--sleep", "0.5"])
    wait_until(lambda: any(e[0] == "step" for e in events(log_of(tmp_path, "cancel", job))), 240, "training steps")
    t_cancel = time.time()
    slurm.run(["scancel", job])
    t_gone = wait_gone(str(tmp_path / "ckpt"), 60)
    time.sleep(3)  # a wrong requeue would show by now
    info = slurm.job(job)
    text = log_of(tmp_path, "cancel", job)
    assert info["JobState"] == "CANCELLED" and info.get("Restarts") == "0", f"{info}\n{text}"
    assert "requeuing job" not in text, text
    # The batch shell says why it does not requeue once its step has ended, then writes the end marker
    # (its EXIT trap). Under load Slurm may kill it first, within KillWait of the cancel (runs A, H and J
    # side by side: srun done 4.6 s after the cancel, the shell killed 50 ms later, no end.json): then
    # neither shows, and the state and restart count above are the whole answer.
    if (tmp_path / f"cancel-{job}" / "end.json").exists():
        assert "not requeuing from here" in text, text
    report("scancel-sticks", cancel_to_all_gone_s=t_gone - t_cancel, state=info["JobState"])


# 3. a rank dies ------------------------------------------------------------------
def test_sigkill_one_rank_every_process_gone_fast_and_the_rank_named(
    slurm_cluster: Any, slurm: SlurmClient, tmp_path: Path
) -> None:
    """Rank 1 (node 2) SIGKILLs itself mid-run: torchrun (--max-restarts 0) gives up, srun's
    --kill-on-bad-exit ends node 1's task, the job is FAILED and the log names rank 1 and SIGKILL."""
    job = submit(slurm_cluster, tmp_path, "killrank", ["-N", "2", "--nproc-per-node", "1"], ["--steps", "400", "--sleep", "0.5", "--kill-at", "6"])
    marker = str(tmp_path / "ckpt")
    m = wait_until(
        lambda: re.search(r"KILLING rank 1 pid=\d+ at step 6 t=([\d.]+)", log_of(tmp_path, "killrank", job)), 240, "rank 1 to kill itself"
    )
    t_kill = float(m.group(1))
    wait_until(lambda: not procs(marker), max(1.0, t_kill + GONE_WITHIN - time.time()), "every process gone within 30 s of the kill")
    t_gone = time.time()
    info = wait_job(slurm, job, 60)
    assert info["JobState"] == "FAILED", info
    logs = torchhpc(slurm_cluster, "logs", f"slurm:{job}", cwd=tmp_path).stdout
    assert re.search(r"rank\s*:\s*1 \(local_rank: 0\)", logs), logs
    assert "SIGKILL" in logs, logs
    st = torchhpc(slurm_cluster, "status", f"slurm:{job}", cwd=tmp_path).stdout
    assert "FAILED" in st, st
    report("rank-sigkill", kill_to_all_gone_s=t_gone - t_kill, state=info["JobState"])


# 4. a node drops off the network --------------------------------------------------
def _node_state(slurm: SlurmClient, node: str) -> str:
    return slurm.run(["sinfo", "-h", "-N", "-n", node, "-o", "%T"], check=False, timeout=30).stdout.strip()


def _netns_of(pid: int) -> str:
    return subprocess.run(["ip", "netns", "identify", str(pid)], capture_output=True, text=True).stdout.strip()


def test_node_link_down_requeues_resumes_and_leaves_no_process(
    own_cluster: Any, own_slurm: SlurmClient, reference: Path, tmp_path: Path
) -> None:
    """``ip -n <node> link set eth0 down`` on the job's second node (whole nodes: --exclusive,
    so no one else's job is on it): Slurm marks the node down and requeues the --requeue job
    (NODE_FAIL); the first node's processes go at once, the cut-off node's once its link is back
    and the node returns to service; the requeued run resumes from the last periodic checkpoint
    and ends bit-identical to the uninterrupted run."""
    job = submit(
        own_cluster, tmp_path, "linkdown", ["-N", "2", "--nproc-per-node", "1", "--opt", "exclusive=1", "--requeue"],
        ["--steps", str(STEPS), "--sleep", "0.5", "--sleep-first-attempt-only", "--ckpt-every", "5"],
    )
    marker = str(tmp_path / "ckpt")
    wait_until(lambda: any(e[0] == "step" and e[1] >= 7 for e in events(log_of(tmp_path, "linkdown", job))), 300, "training steps")
    nodes = own_slurm.run(["scontrol", "show", "hostnames", own_slurm.job(job)["NodeList"]]).stdout.split()
    victim = nodes[1]
    ns = own_cluster.netns(victim)
    victim_pids = {pid for pid, _ in procs(marker) if _netns_of(pid) == ns}
    assert victim_pids, f"no process of the job found in {ns}"
    t_down = time.time()
    try:
        subprocess.run(["ip", "-n", ns, "link", "set", "eth0", "down"], check=True)
        info = wait_until(lambda: (lambda i: i if i.get("Restarts", "0") != "0" or i.get("JobState") in
                                   ("NODE_FAIL", "FAILED") else None)(own_slurm.job(job)), 120, "Slurm to notice the node")
        t_failed = time.time()
        wait_until(lambda: not [p for p, _ in procs(marker) if p not in victim_pids], GONE_WITHIN, "the other node's processes to exit")
        t_others_gone = time.time()
    finally:
        subprocess.run(["ip", "-n", ns, "link", "set", "eth0", "up"], check=True)
        t_up = time.time()
    assert int(info.get("Restarts", "0")) >= 1, f"the --requeue job was not requeued: {info}"
    wait_until(lambda: not (set(p for p, _ in procs(marker)) & victim_pids), 120, "the cut-off node's processes to exit")
    t_victim_gone = time.time()

    def back() -> bool:
        state = _node_state(own_slurm, victim)
        return bool(state) and "down" not in state and "*" not in state and "drain" not in state

    deadline = time.monotonic() + 90
    while not back() and time.monotonic() < deadline:
        time.sleep(1)
    t_back = time.time()
    if not back():  # our own node: put it back, then fail so the finding is seen
        own_slurm.run(["scontrol", "update", f"nodename={victim}", "state=resume"], check=False)
        pytest.fail(f"{victim} stayed {_node_state(own_slurm, victim)} 90 s after its link came back")
    final = wait_job(own_slurm, job, 420)
    text = log_of(tmp_path, "linkdown", job)
    assert final["JobState"] == "COMPLETED", text
    resumed = next(e for e in events(text) if e[0] == "START" and e[2] >= 1)
    reached = max(e[1] for e in events(text) if e[2] == 0 and e[0] == "step")
    assert resumed[1] >= 5 and resumed[1] % 5 == 0, text  # from the newest periodic checkpoint
    assert_bit_identical(tmp_path / "final.pt", reference)
    report(
        "link-down", down_to_requeued_s=t_failed - t_down, down_to_other_node_clean_s=t_others_gone - t_down,
        link_up_to_cut_off_node_clean_s=max(0.0, t_victim_gone - t_up), link_up_to_node_back_s=t_back - t_up,
        down_to_resumed_s=resumed[3] - t_down, steps_redone_since_last_checkpoint=reached - resumed[1], steps_lost=0,
    )


# 5. SIGKILL while a checkpoint is being written -------------------------------------
def test_sigkill_during_checkpoint_write_keeps_the_previous_one_resumable(
    slurm_cluster: Any, slurm: SlurmClient, reference: Path, tmp_path: Path
) -> None:
    """Rank 0 is SIGKILLed while step 10's checkpoint is half written (its fsync is slowed):
    step 5's checkpoint stays intact, the job fails fast, and a new job resumes from step 5
    and ends bit-identical to the uninterrupted run."""
    from torchhpc.dist import checkpoint

    job = submit(
        slurm_cluster, tmp_path, "torn", ["-N", "2", "--nproc-per-node", "1"],
        ["--steps", str(STEPS), "--ckpt-every", "5", "--slow-save-at", "10", "--sleep", "0.2"],
    )
    ckpt, marker = tmp_path / "ckpt", str(tmp_path / "ckpt")
    m = wait_until(lambda: re.search(r"SAVING slowly pid=(\d+)", log_of(tmp_path, "torn", job)), 240, "the slow save")
    tmp = wait_until(lambda: list(ckpt.glob(".ckpt-000000010.*.tmp")), 30, "the temporary checkpoint directory")
    assert any(f.stat().st_size > 0 for f in tmp[0].iterdir())
    t_kill = time.time()
    os.kill(int(m.group(1)), signal.SIGKILL)
    wait_until(lambda: not procs(marker), GONE_WITHIN, "every process gone within 30 s of the kill")
    t_gone = time.time()
    assert wait_job(slurm, job, 60)["JobState"] == "FAILED"
    assert [p.name for p in checkpoint.list_checkpoints(ckpt)] == ["ckpt-000000005"]

    again = submit(slurm_cluster, tmp_path, "torn", ["-N", "2", "--nproc-per-node", "1"], ["--steps", str(STEPS), "--ckpt-every", "5"])
    info = wait_job(slurm, again, 240)
    text = log_of(tmp_path, "torn", again)
    assert info["JobState"] == "COMPLETED", text
    start = next(e for e in events(text) if e[0] == "START")
    assert start[1] == 5, text
    assert_bit_identical(tmp_path / "final.pt", reference)
    report(
        "sigkill-during-save", kill_to_all_gone_s=t_gone - t_kill, kill_to_resumed_s=start[3] - t_kill,
        resumed_from_step=start[1], steps_redone_since_last_checkpoint=10 - start[1], steps_lost=0,
    )


# 6. two jobs on one node -------------------------------------------------------------
LISTENER = (
    "import socket, sys, time\n"
    "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind(('0.0.0.0', int(sys.argv[1]))); s.listen(); print('listening', flush=True); time.sleep(600)\n"
)


def test_two_jobs_on_one_node_at_once_both_finish(
    own_cluster: Any, own_slurm: SlurmClient, reference: Path, tmp_path: Path
) -> None:
    """Two 1-node torchrun jobs (2 ranks each) on node3 at the same time; the first job's
    derived port is already taken on node3 when it starts, so it must move to the next one."""
    node = "node3"
    common = ["-N", "1", "-n", "2", "--opt", f"nodelist={node}"]
    train = ["--steps", str(STEPS), "--sleep", "0.3"]
    job_a = submit(own_cluster, tmp_path / "a", "a", [*common, "--opt", "sbatch_extra=--hold"], train)
    port_a = 10000 + int(job_a) % 20000
    listener = subprocess.Popen(
        ["ip", "netns", "exec", own_cluster.netns(node), sys.executable, "-c", LISTENER, str(port_a)],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert listener.stdout is not None and listener.stdout.readline().strip() == "listening"
        job_b = submit(own_cluster, tmp_path / "b", "b", common, train)
        own_slurm.run(["scontrol", "release", job_a])
        infos = own_slurm.wait_all([job_a, job_b], 300)
    finally:
        listener.kill()
        listener.wait()
    texts = {"a": log_of(tmp_path / "a", "a", job_a), "b": log_of(tmp_path / "b", "b", job_b)}
    for (name, text), info in zip(texts.items(), infos.values()):
        assert info["JobState"] == "COMPLETED", text
        assert info["NodeList"] == node
        assert_bit_identical(tmp_path / name / "final.pt", reference)
    ports = {k: int(re.search(r"master [\d.]+:(\d+)", t).group(1)) for k, t in texts.items()}  # type: ignore[union-attr]
    assert ports["a"] == 10000 + (int(job_a) + 7919) % 20000, texts["a"]  # moved off the taken port
    assert ports["a"] != ports["b"]
    spans = {k: (next(e[3] for e in events(t) if e[0] == "START"), next(e[3] for e in events(t) if e[0] == "DONE")) for k, t in texts.items()}
    assert spans["a"][0] < spans["b"][1] and spans["b"][0] < spans["a"][1], f"the jobs did not overlap: {spans}"
    overlap = min(spans["a"][1], spans["b"][1]) - max(spans["a"][0], spans["b"][0])
    report("two-jobs-one-node", port_a=ports["a"], port_b=ports["b"], overlap_s=overlap, steps_lost=0)
