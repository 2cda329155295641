"""The local scheduler running real processes: contract, output, failure, signals, no orphans.

Workers are tiny ``python -c`` programs (no torch) that write their pid and
environment to files, so each test can check what every rank saw and that
every process it started is gone afterwards.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import PYTHON, REPO
from torchhpc.core.spec import Entrypoint, JobSpec
from torchhpc.errors import CommandNotFound, JobFailed, SchedulerError
from torchhpc.schedulers.local.local import LocalScheduler
from torchhpc.schedulers.local.ranks import CONTRACT

TORCHHPC = [PYTHON, "-m", "torchhpc"]

# Each rank writes pid-RANK and env-RANK.json into $OUT, then does what $ACT says for its rank.
WORKER = r"""
import json, os, signal, subprocess, sys, time
out, rank = os.environ["OUT"], os.environ["RANK"]
with open(os.path.join(out, "env-" + rank + ".json"), "w") as f:
    json.dump(dict(os.environ), f)
pids = [os.getpid()]
if os.environ.get("CHILD"):  # a grandchild in the rank's own group: must die with the rank
    pids.append(subprocess.Popen(["sleep", "300"]).pid)
with open(os.path.join(out, "pid-" + rank), "w") as f:
    f.write(" ".join(map(str, pids)))
print("hello from", rank, flush=True)
print("err from", rank, file=sys.stderr, flush=True)
act = json.loads(os.environ.get("ACT", "{}")).get(rank, "exit0")
if act == "exit3":
    sys.exit(3)
if act == "kill9":
    os.kill(os.getpid(), signal.SIGKILL)
if act == "sleep":
    time.sleep(300)
if act == "ignore_term":  # survives SIGTERM: teardown must escalate to SIGKILL
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(300)
"""


def worker_cmd() -> list[str]:
    return [PYTHON, "-c", WORKER]


def job_env(out: Path, act: dict[str, str] | None = None, child: bool = False) -> dict[str, str]:
    env = dict(os.environ, OUT=str(out), ACT=json.dumps(act or {}))
    if child:
        env["CHILD"] = "1"
    return env


def alive(pid: int) -> bool:
    """Running or stopped; a zombie waiting for PID 1 to reap it counts as gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def recorded_pids(out: Path) -> list[int]:
    return [int(p) for f in sorted(out.glob("pid-*")) for p in f.read_text().split()]


def assert_all_gone(pids: list[int], patience: float = 15.0) -> None:
    """Every pid ends; we wait (a reaped-late zombie is fine) but never accept a survivor."""
    assert pids, "the workers recorded no pids"
    deadline = time.monotonic() + patience
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    survivors = [p for p in pids if alive(p)]
    for p in survivors:  # don't leak them into the rest of the suite
        os.kill(p, signal.SIGKILL)
    assert not survivors, f"processes left behind: {survivors}"


def wait_for_files(out: Path, pattern: str, count: int, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 60
    while len(list(out.glob(pattern))) < count:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"only {list(out.glob(pattern))} after 60 s"
        time.sleep(0.05)


def cli(args: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TORCHHPC, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)


# -- the acceptance check -------------------------------------------------------


def test_acceptance_rank1_exit3_stops_the_others(tmp_path: Path) -> None:
    """The issue's command, verbatim, plus pid files to prove nothing is left behind."""
    code = (
        "import os, sys, time; "
        "open(os.path.join(os.environ['OUT'], 'pid-' + os.environ['RANK']), 'w').write(str(os.getpid())); "
        "sys.exit(3) if os.environ['RANK'] == '1' else time.sleep(60)"
    )
    cp = cli(["run", "-n", "3", "--", "python", "-c", code], job_env(tmp_path), timeout=60)
    assert cp.returncode == 3, cp.stderr
    assert "Error: rank 1 exited with code 3; stopped the other 2 ranks" in cp.stderr
    assert_all_gone(recorded_pids(tmp_path))


# -- contract and output --------------------------------------------------------


def test_every_rank_gets_the_torchrun_contract(tmp_path: Path) -> None:
    cp = cli(["run", "-n", "3", "-e", "EXTRA=a b", "--", *worker_cmd()], job_env(tmp_path))
    assert cp.returncode == 0, cp.stderr
    envs = [json.loads((tmp_path / f"env-{r}.json").read_text()) for r in range(3)]
    run_ids = {e["TORCHELASTIC_RUN_ID"] for e in envs}
    ports = {e["MASTER_PORT"] for e in envs}
    assert len(run_ids) == 1 and len(ports) == 1
    for r, env in enumerate(envs):
        missing = [k for k in CONTRACT if k not in env]
        assert not missing
        assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == (str(r), str(r), "3", "3")
        assert env["GROUP_RANK"] == "0" and env["MASTER_ADDR"] == "127.0.0.1"
        assert env["EXTRA"] == "a b" and env["PYTHONUNBUFFERED"] == "1"
    # every rank in its own session (and so its own process group)
    pids = recorded_pids(tmp_path)
    assert len(set(pids)) == 3


def test_output_is_prefixed_per_rank(tmp_path: Path) -> None:
    cp = cli(["run", "-n", "3", "--", *worker_cmd()], job_env(tmp_path))
    assert cp.returncode == 0, cp.stderr
    assert sorted(cp.stdout.splitlines()) == [f"[rank{r}]: hello from {r}" for r in range(3)]
    assert sorted(ln for ln in cp.stderr.splitlines() if "err from" in ln) == [
        f"[rank{r}]: err from {r}" for r in range(3)
    ]


def test_rank0_only(tmp_path: Path) -> None:
    cp = cli(["run", "-n", "3", "--rank0-only", "--", *worker_cmd()], job_env(tmp_path))
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.splitlines() == ["[rank0]: hello from 0"]
    assert "[rank1]" not in cp.stderr and "[rank2]" not in cp.stderr


def test_rank0_only_still_shows_a_failing_ranks_last_lines(tmp_path: Path) -> None:
    env = job_env(tmp_path, {"1": "exit3", "0": "sleep", "2": "sleep"})
    cp = cli(["run", "-n", "3", "--rank0-only", "--", *worker_cmd()], env, timeout=60)
    assert cp.returncode == 3
    assert "[rank1]: err from 1" in cp.stderr
    assert "[rank2]" not in cp.stdout + cp.stderr
    assert_all_gone(recorded_pids(tmp_path))


def test_fixed_master_port_from_env(tmp_path: Path) -> None:
    cp = cli(["run", "-n", "2", "-e", "MASTER_PORT=29517", "--", *worker_cmd()], job_env(tmp_path))
    assert cp.returncode == 0, cp.stderr
    assert json.loads((tmp_path / "env-1.json").read_text())["MASTER_PORT"] == "29517"


# -- failures -------------------------------------------------------------------


def test_killed_rank_is_named_with_its_signal(tmp_path: Path) -> None:
    env = job_env(tmp_path, {"1": "kill9", "0": "sleep"}, child=True)
    cp = cli(["run", "-n", "2", "--", *worker_cmd()], env, timeout=60)
    assert cp.returncode == 128 + 9
    assert "rank 1 was killed by signal 9 (SIGKILL); stopped the other rank" in cp.stderr
    # rank 1's `sleep` grandchild lost its parent but not its process group: swept too
    assert_all_gone(recorded_pids(tmp_path))


def test_sigterm_ignoring_rank_gets_sigkill(tmp_path: Path) -> None:
    env = job_env(tmp_path, {"0": "exit3", "1": "ignore_term"}, child=True)
    spec = JobSpec(Entrypoint.parse(worker_cmd()), nproc_per_node=2, options=(("grace", "1"),))
    sched = LocalScheduler()
    old = dict(os.environ)
    os.environ.update(env)
    try:
        with pytest.raises(JobFailed) as e:
            sched.run(sched.render(spec), stdout=io.StringIO(), stderr=io.StringIO())
    finally:
        os.environ.clear()
        os.environ.update(old)
    assert e.value.message == "rank 0 exited with code 3; stopped the other rank"
    assert e.value.exit_code == 3
    assert_all_gone(recorded_pids(tmp_path))


def test_library_run_returns_zero_and_captures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in job_env(tmp_path).items():
        monkeypatch.setenv(k, v)
    sched = LocalScheduler()
    out, err = io.StringIO(), io.StringIO()
    spec = JobSpec(Entrypoint.parse(worker_cmd()), nproc_per_node=2)
    assert sched.run(sched.render(spec), stdout=out, stderr=err) == 0
    assert sorted(out.getvalue().splitlines()) == ["[rank0]: hello from 0", "[rank1]: hello from 1"]
    job_id = sched.schedule(sched.render(spec))
    assert job_id.startswith("local-")
    assert json.loads((tmp_path / "env-0.json").read_text())["TORCHELASTIC_RUN_ID"] == job_id
    assert sched.wait(job_id).ok


def test_schedule_records_a_failure_for_status(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Job API path: schedule() returns an id like a batch submit; the failure is in status()."""
    for k, v in job_env(tmp_path, {"1": "exit3"}).items():
        monkeypatch.setenv(k, v)
    sched = LocalScheduler()
    spec = JobSpec(Entrypoint.parse(worker_cmd()), nproc_per_node=2)
    job_id = sched.schedule(sched.render(spec))
    st = LocalScheduler().status(job_id)  # a fresh instance, as get_scheduler() makes
    assert (st.state, st.exit_code, st.terminal, st.ok) == ("FAILED", 3, True, False)
    assert "rank 1 exited with code 3" in st.reason
    with pytest.raises(SchedulerError, match="local:nope"):
        sched.status("nope")


def test_missing_program(tmp_path: Path) -> None:
    with pytest.raises(CommandNotFound):
        sched = LocalScheduler()
        sched.run(sched.render(JobSpec(Entrypoint.parse(["no-such-program-xyz"]), nproc_per_node=2)))
    cp = cli(["run", "-n", "2", "--", "no-such-program-xyz"], dict(os.environ))
    assert cp.returncode != 0 and "no-such-program-xyz" in cp.stderr


# -- signals to the parent ------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_to_parent_tears_everything_down(tmp_path: Path, sig: signal.Signals) -> None:
    env = job_env(tmp_path, {"0": "sleep", "1": "sleep", "2": "ignore_term"}, child=True)
    proc = subprocess.Popen(
        [*TORCHHPC, "run", "-n", "3", "--", *worker_cmd()],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_files(tmp_path, "pid-*", 3, proc)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + sig
    assert f"interrupted by {sig.name}; stopped 3 running ranks of 3" in err
    assert_all_gone(recorded_pids(tmp_path))


# -- the dry run is real bash ---------------------------------------------------


def test_dry_run_script_runs_under_bash(tmp_path: Path, hostile: str) -> None:
    """The printed script, pasted into bash, starts the same ranks with the values unchanged."""
    # one write per rank: two unbuffered ranks printing to one pipe may interleave print's two writes
    probe = (
        "import json, os, sys; "
        "os.write(1, (json.dumps([os.environ['RANK'], os.environ['VAL'], sys.argv[1:]]) + '\\n').encode())"
    )
    spec = JobSpec(Entrypoint.parse([sys.executable, "-c", probe, hostile]), nproc_per_node=2, env=(("VAL", hostile),))
    script = LocalScheduler().render(spec).script
    assert script is not None
    cp = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    seen = sorted(json.loads(line) for line in cp.stdout.splitlines())
    assert seen == [["0", hostile, [hostile]], ["1", hostile, [hostile]]]
    assert not list(tmp_path.glob("pwned*"))


def test_output_survives_an_ascii_stream(tmp_path: Path) -> None:
    """A rank printing "≈" to an ASCII-only stdout is escaped, not lost (and never blocks the rank)."""
    raw = io.BytesIO()
    out = io.TextIOWrapper(raw, encoding="ascii")
    spec = JobSpec(Entrypoint.parse([PYTHON, "-c", "print('pi ≈ 3'); print('next')"]), nproc_per_node=1)
    sched = LocalScheduler()
    assert sched.run(sched.render(spec), stdout=out, stderr=io.StringIO()) == 0
    out.flush()
    assert raw.getvalue().decode().splitlines() == ["[rank0]: pi \\u2248 3", "[rank0]: next"]


def test_torchhpc_env_detector_sees_torchrun(tmp_path: Path) -> None:
    """Inside a local job torchhpc's own detector reports a torchrun-style source, per rank."""
    cp = cli(["run", "-n", "2", "--", *TORCHHPC, "env", "--json"], dict(os.environ))
    assert cp.returncode == 0, cp.stderr
    per_rank: dict[str, list[str]] = {"0": [], "1": []}
    for line in cp.stdout.splitlines():
        rank, _, text = line.partition("]: ")
        per_rank[rank.removeprefix("[rank")].append(text)
    seen = [json.loads("\n".join(per_rank[r])) for r in ("0", "1")]
    assert [s["rank"] for s in seen] == [0, 1]
    assert all(s["source"] == "torchrun" and s["world_size"] == 2 for s in seen)
    assert seen[0]["job_id"] == seen[1]["job_id"] and seen[0]["job_id"].startswith("local-")
