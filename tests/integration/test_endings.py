"""One code per ending on the real cluster, read back at once and again after accounting takes over (issue 70).

Five endings run side by side on a 2-node cluster of the module's own with accounting and a short
``MinJobAge`` (30 s): a hang the client's ``--hang-timeout`` watch cancels, a cancel while running, a
cancel while pending, a time limit the program ignores, and a time-limit stop the ranks take with
``--max-requeues 0`` (the warning sent on demand: ``scancel --batch --signal=USR2``, what the limit does).
Each is read by ``wait``, ``status --json``, ``diagnose --json`` and ``events --json`` right after its
end, while ``scontrol`` still knows it, and again once the controller has forgotten it (its purge runs
every 60 s) and only ``sacct`` has it (``CANCELLED by 0|0:0``, ``TIMEOUT|0:0``): the same code each time,
the README table's. Mostly waiting: the time limit's minute, then the controller's purge.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cli_run import torchhpc
from tests.conftest import hang_timeout
from tests.integration.conftest import OWN_FIRST_JOB_ID, TERMINAL_STATES, SlurmClient, cluster_of_its_own
from torchhpc.devcluster import ClusterState

pytestmark = pytest.mark.cluster("slurm")

MIN_JOB_AGE = 30
SLEEPY = "import sys, time\nprint('start', flush=True)\ntime.sleep(float(sys.argv[1]))\n"
STOPPER = (
    "import time\nfrom torchhpc.dist import should_stop\n"
    "for step in range(100):\n"
    "    if should_stop():\n        print(f'stopped at step {step}', flush=True)\n        break\n"
    "    print(f'step {step}', flush=True)\n    time.sleep(1)\n"
)
# ending -> (state, the code every reader gives): README.md's exit-code table
EXPECTED = {
    "hang": ("CANCELLED", 81),
    "cancel-running": ("CANCELLED", 143),
    "cancel-pending": ("CANCELLED", 143),
    "time-limit": ("TIMEOUT", 143),
    "stop-unfinished": ("TIMEOUT", 85),
}


@pytest.fixture(scope="module")
def own_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterState]:
    """This module's cluster: accounting, and jobs forgotten by the controller MIN_JOB_AGE s after their end."""
    with cluster_of_its_own(tmp_path_factory, "aged", 2, OWN_FIRST_JOB_ID + 50000, accounting=True,
                            min_job_age=MIN_JOB_AGE) as state:
        yield state


def _submit(cluster: ClusterState, cwd: Path, name: str, *args: str) -> str:
    done = torchhpc(cluster, "run", "--scheduler", "slurm", "--nodes", "1", "--name", name, "--output-dir", str(cwd),
                    *args, cwd=cwd)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.split("Submitted slurm:")[1].split()[0]


def _until(what: str, check: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s"
        time.sleep(0.5)


def _readings(cluster: ClusterState, cwd: Path, job: str) -> dict[str, Any]:
    """What each reader says of the job: exit codes, and the states status and diagnose print."""
    handle = f"slurm:{job}"
    waited = torchhpc(cluster, "wait", handle, "--timeout", "60", cwd=cwd)
    st = json.loads(torchhpc(cluster, "status", handle, "--json", cwd=cwd).stdout)
    diag = json.loads(torchhpc(cluster, "diagnose", "--json", handle, cwd=cwd).stdout)
    ev = json.loads(torchhpc(cluster, "events", "--json", handle, cwd=cwd).stdout)
    end = [e["text"] for e in ev["events"] if e["kind"] == "end"]
    return {"wait": waited.returncode, "status": (st["state"], st["exit_code"]),
            "diagnose": (diag["state"], diag["exit_code"]), "events": end}


def _one_code(readings: dict[str, Any], state: str, code: int) -> bool:
    return (readings["wait"] == code and readings["status"] == (state, code) and readings["diagnose"] == (state, code)
            and readings["events"] == [f"{state}, exit {code}"])


def _known(slurm: SlurmClient, job: str) -> bool:
    return slurm.run(["scontrol", "show", "job", "-o", job], check=False, timeout=30).returncode == 0


def test_each_ending_has_one_code_at_once_and_after_accounting(own_cluster: ClusterState, own_slurm: SlurmClient,
                                                               tmp_path: Path) -> None:
    (tmp_path / "sleepy.py").write_text(SLEEPY)
    (tmp_path / "stopper.py").write_text(STOPPER)
    env = own_cluster.client_env()
    # the hang: run --wait with the client's watch, in the background
    hang = subprocess.Popen([sys.executable, "-m", "torchhpc", "run", "--scheduler", "slurm", "--nodes", "1", "--name",
                             "hang", "--output-dir", str(tmp_path), "--wait", "--hang-timeout", hang_timeout(15), "sleepy.py", "600"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    jobs = {
        "cancel-running": _submit(own_cluster, tmp_path, "running", "sleepy.py", "600"),
        "cancel-pending": _submit(own_cluster, tmp_path, "pending", "--opt", "sbatch_extra=--begin=now+3600",
                                  "sleepy.py", "1"),
        "time-limit": _submit(own_cluster, tmp_path, "limit", "--time", "1", "sleepy.py", "600"),
        "stop-unfinished": _submit(own_cluster, tmp_path, "stop", "--launcher", "srun", "--time", "10",
                                   "--signal-before", "30", "--requeue", "--max-requeues", "0", "stopper.py"),
    }
    try:
        _until("the running job's rank printed", lambda: any(tmp_path.glob(f"running-{jobs['cancel-running']}/ranks/*")), 120)
        stop_log = tmp_path / f"stop-{jobs['stop-unfinished']}"
        _until("the stopping job's first step", lambda: "step 1" in "".join(p.read_text() for p in stop_log.glob("ranks/*")), 120)
        torchhpc(own_cluster, "cancel", f"slurm:{jobs['cancel-running']}", cwd=tmp_path)
        torchhpc(own_cluster, "cancel", f"slurm:{jobs['cancel-pending']}", cwd=tmp_path)
        own_slurm.run(["scancel", "--batch", "--signal=USR2", jobs["stop-unfinished"]])
        # Each ending is read the moment it is over: the controller forgets a job MinJobAge (30 s) after its end,
        # and the hang's client returns only after its diagnosis (issue 66's run 1, at load 24: past that).
        at_once: dict[str, dict[str, Any]] = {}
        deadline = time.monotonic() + 300
        while len(at_once) < len(EXPECTED):
            made = [d.name.split("-", 1)[1] for d in tmp_path.glob("hang-*") if d.is_dir()]  # at submit: hang-<id>/
            if made and "hang" not in jobs:
                jobs["hang"] = made[0]
            for ending, job in jobs.items():
                if ending not in at_once and own_slurm.job(job).get("JobState") in TERMINAL_STATES:
                    at_once[ending] = _readings(own_cluster, tmp_path, job)
            assert time.monotonic() < deadline, f"still not over after 300 s: {sorted(set(EXPECTED) - set(at_once))}"
            time.sleep(0.5)
        out, _ = hang.communicate(timeout=240)
        assert hang.returncode == 81 and f"Submitted slurm:{jobs['hang']}" in out, out
        _until("the controller forgets the jobs", lambda: not any(_known(own_slurm, j) for j in jobs.values()),
               MIN_JOB_AGE + 120)
        later = {ending: _readings(own_cluster, tmp_path, job) for ending, job in jobs.items()}
    finally:
        hang.kill()
        for job in jobs.values():
            own_slurm.run(["scancel", job], check=False)
    wrong = {ending: {"at once": at_once[ending], "from sacct": later[ending]} for ending, (state, code) in EXPECTED.items()
             if not (_one_code(at_once[ending], state, code) and _one_code(later[ending], state, code))}
    assert not wrong, f"expected {EXPECTED}, read {wrong}"
