"""--after-ok / --after-any for real: on the dev cluster's Slurm, and with the local supervisor.

Each job is a one-line command (no torch import). A parent waits for the test's ``go`` file, then
writes its file and ends; a dependent job marks that it started, then checks that its parent's file
exists. The test makes ``go`` only once every child is either PENDING on its dependency or has
started: so "it ran after the parent ended" is proved by the job's own exit status, by an ordering
and not a timing, and a dropped dependency fails (the child starts while its parent waits for ``go``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import PYTHON

pytestmark = pytest.mark.usefixtures("clean_user_env")


def torchhpc(*args: str, env: dict[str, str] | None = None, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "torchhpc", *args], env=env or dict(os.environ), cwd=cwd,
                          capture_output=True, text=True, timeout=240)


def submit(*args: str, env: dict[str, str] | None = None, cwd: Path) -> str:
    done = torchhpc("run", "--json", *args, env=env, cwd=cwd)
    assert done.returncode == 0, done.stdout + done.stderr
    return str(json.loads(done.stdout)["job_id"])


def status(handle: str, env: dict[str, str] | None, cwd: Path) -> dict[str, Any]:
    done = torchhpc("wait", handle, "--timeout", "180", env=env, cwd=cwd)
    done = torchhpc("status", handle, "--json", env=env, cwd=cwd)
    assert done.returncode == 0, done.stdout + done.stderr
    return dict(json.loads(done.stdout))


def scenario(flags: list[str], env: dict[str, str] | None, cwd: Path) -> dict[str, dict[str, Any]]:
    """ok: a job that writes ok.done; bad: one that fails. Then after-ok ok, after-ok bad, after-any bad."""
    go = str(cwd / "go")

    def touch(name: str, code: int) -> list[str]:  # waits for go (at most 3 min), then writes name and ends
        return ["--", PYTHON, "-c", f"import os, sys, time; any(os.path.exists({go!r}) or time.sleep(0.1) "
                                    f"for _ in range(1800)); open({name!r}, 'w'); sys.exit({code})"]

    def needs(name: str) -> list[str]:  # marks its start, then needs its parent's file
        return ["--", PYTHON, "-c", f"import os, sys; open({name!r} + '.child', 'a'); "
                                    f"sys.exit(0 if os.path.exists({name!r}) else 5)"]

    ok = submit(*flags, "--name", "ok", *touch(str(cwd / "ok.done"), 0), env=env, cwd=cwd)
    bad = submit(*flags, "--name", "bad", *touch(str(cwd / "bad.done"), 3), env=env, cwd=cwd)
    jobs = {
        "after_ok": submit(*flags, "--after-ok", ok, "--name", "after_ok", *needs(str(cwd / "ok.done")), env=env, cwd=cwd),
        "never": submit(*flags, "--after", bad, "--name", "never", *needs(str(cwd / "bad.done")), env=env, cwd=cwd),
        "after_any": submit(*flags, "--after-any", bad, "--name", "after_any", *needs(str(cwd / "bad.done")),
                            env=env, cwd=cwd),
    }
    name = "slurm" if "slurm" in flags else "local"
    for job in jobs.values():  # each child waits for its dependency, or (the dependency lost) has started
        for _ in range(120):
            st = json.loads(torchhpc("status", f"{name}:{job}", "--json", env=env, cwd=cwd).stdout)
            if (st["state"], st["reason"]) == ("PENDING", "Dependency") or list(cwd.glob("*.child")):
                break
            time.sleep(0.5)
    Path(go).touch()
    return {k: status(f"{name}:{v}", env, cwd) for k, v in jobs.items()}


def check(result: dict[str, dict[str, Any]]) -> None:
    assert result["after_ok"]["state"] == "COMPLETED", result  # ran, and after ok.done existed
    assert result["after_any"]["state"] == "COMPLETED", result  # ran after the failure
    never = result["never"]
    assert never["state"] == "CANCELLED" and never["reason"] == "DependencyNeverSatisfied", never
    assert never["after"][0]["verdict"] == "never" and never["after"][0]["state"] == "FAILED", never


@pytest.mark.cluster("slurm")
def test_slurm_after_ok_after_any_and_never(slurm_cluster: Any, tmp_path: Path) -> None:
    check(scenario(["--scheduler", "slurm", "--launcher", "srun"], slurm_cluster.client_env(), tmp_path))


def test_local_supervisor_waits_and_reports_never(tmp_path: Path) -> None:
    check(scenario(["--background"], None, tmp_path))


def test_local_foreground_run_refuses_to_start_after_a_failure(tmp_path: Path) -> None:
    bad = submit("--background", "--", PYTHON, "-c", "raise SystemExit(3)", cwd=tmp_path)
    done = torchhpc("run", "--after-ok", bad, "--", PYTHON, "-c", "print('ran')", cwd=tmp_path)
    assert done.returncode == 1 and "ran" not in done.stdout, done.stdout + done.stderr
    assert f"DependencyNeverSatisfied: after-ok local:{bad}: FAILED (exit 3): never satisfied" in done.stderr
    done = torchhpc("run", "--after-fail", bad, "--", PYTHON, "-c", "print('ran')", cwd=tmp_path)
    assert done.returncode == 0 and "ran" in done.stdout, done.stdout + done.stderr


def test_local_sweep_after_ok_never_and_after_any(tmp_path: Path) -> None:
    """sweep takes the same flags: its array job waits in the supervisor like a single job."""
    bad = submit("--background", "--", PYTHON, "-c", "raise SystemExit(3)", cwd=tmp_path)
    handles = []
    for flag in ("--after-ok", "--after-any"):
        done = torchhpc("sweep", "--grid", "a=1,2", flag, bad, "--", PYTHON, "-c", "import sys; print(sys.argv)", "{a}",
                        cwd=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        handles.append(done.stdout.split("Submitted ", 1)[1].split(":", 2)[:2])
    (_, never), (_, anyway) = handles
    assert status(f"local:{never}", None, tmp_path)["reason"] == "DependencyNeverSatisfied"
    assert status(f"local:{anyway}", None, tmp_path)["state"] == "COMPLETED"
