"""Issue 64: every kind of job read back by every command, locally, against one contract.

Each kind is a real local job (real processes and signals): a plain run that completes and one that
fails, an array task and a sweep task that fail, a function's array (``Executor.map_array``), a run that
hung once and completed on its restart, a cancelled run, a run whose dependency failed (never started),
and a pipeline step. Every read-back command is run on each, and these must hold:

* the exit code of ``wait`` is the code the record carries in ``status --json``, the ``end`` row of
  ``events --json`` and ``diagnose --json``;
* every ``--json`` output parses as strict JSON (no ``Infinity``), and no command prints a traceback;
* ``logs --rank R`` of a rank the job does not have is an error (2), never an empty success;
* a verdict names only ranks the job has, none for a job that never started, and "no failure" for a
  job whose record says COMPLETED (restarts or not).

A new read-back command (a subcommand that takes a JOB) must join :data:`COMMANDS`, or
:func:`test_every_read_back_command_is_in_the_matrix` fails.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, hang_timeout

PY = sys.executable
# kind -> (world size, the record's exit code, whether it ran)
KINDS: dict[str, tuple[int, int, bool]] = {
    "plain, completed": (2, 0, True),
    "plain, failed": (2, 3, True),
    "array task": (1, 1, True),
    "sweep task": (1, 1, True),
    "function": (1, 1, True),
    "restarted, completed": (1, 0, True),
    "cancelled": (1, 143, True),
    "never started": (1, 1, False),
    "pipeline step": (1, 5, True),
}
COMMANDS = ("status", "wait", "logs", "diagnose", "events", "top", "list")
NOT_READERS = ("cancel",)  # takes a JOB but changes it: the contract tests cover it (test_exit_contract)


def _strict(text: str) -> Any:
    def refuse(word: str) -> None:
        raise AssertionError(f"not strict JSON: {word}")

    return json.loads(text, parse_constant=refuse)


class Jobs:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHHPC_", "SBATCH_"))}
        self.env.update(HOME=str(root), TORCHHPC_STATE_DIR=str(root / "state"), PYTHONPATH=str(REPO / "src"))
        self.handles: dict[str, str] = {}

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([PY, "-m", "torchhpc", *args], capture_output=True, text=True, timeout=timeout,
                              env=self.env, cwd=self.root)

    def submit(self, *args: str) -> str:
        done = self.cli("run", "--background", *args)
        assert done.returncode == 0, done.stdout + done.stderr
        return re.search(r"Submitted (local:\w+)", done.stdout).group(1)  # type: ignore[union-attr]

    def py(self, name: str, text: str) -> str:
        (self.root / name).write_text(text)
        return name


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Jobs:
    j = Jobs(tmp_path_factory.mktemp("kinds"))
    j.handles["plain, completed"] = j.submit("-n", "2", "--", PY, "-c", "print('hello')")
    j.handles["plain, failed"] = j.submit("-n", "2", j.py("fail.py", "import os, sys\n"
                                                          "sys.exit(3) if os.environ['RANK'] == '1' else None\n"))
    j.handles["array task"] = j.submit("--array", "0-1", j.py("task.py", "import os\n"
                                       "if os.environ['TORCHHPC_ARRAY_INDEX'] == '0':\n    raise ValueError('bad')\n"))
    sweep = j.cli("sweep", "--grid", "x=0,1", "--output-dir", "sw", "--", PY, "task_x.py", "{x}")
    j.py("task_x.py", "import sys\nif sys.argv[1] == '0':\n    raise ValueError('bad x')\n")
    assert sweep.returncode == 0, sweep.stderr
    j.handles["sweep task"] = json.loads((j.root / "sw" / "sweep.json").read_text())["handle"]
    fn = j.cli("run", "-n", "1", "--", PY, "-c", (
        "import torchhpc, json\n"
        "def f(x):\n    if x == 0:\n        raise ValueError('no zero')\n    return x\n"
        "jobs = torchhpc.Executor(folder='fn', scheduler='local').map_array(f, [0, 1])\n"
        "print('HANDLE', jobs[0].handle.scheduler.name + ':' + jobs[0].handle.job_id)\n"), timeout=300)
    m = re.search(r"HANDLE (local:\w+)", fn.stdout)
    assert m, fn.stdout + fn.stderr
    j.handles["function"] = m.group(1)
    j.handles["restarted, completed"] = j.submit("--max-restarts", "1", "--hang-timeout", hang_timeout(5), j.py("restart.py", (
        "import os, time\nprint('attempt', os.environ['TORCHHPC_RESTART_COUNT'], flush=True)\n"
        "if os.environ['TORCHHPC_RESTART_COUNT'] == '0':\n    time.sleep(600)\n")))
    cancelled = j.submit("--", PY, "-c", "import time; print('up', flush=True); time.sleep(600)")
    j.handles["cancelled"] = cancelled
    j.handles["never started"] = j.submit("--after-ok", j.handles["plain, failed"], "--", PY, "-c", "pass")
    (j.root / "p.toml").write_text('[steps.a]\nprogram = ["ok.py"]\n[steps.b]\nprogram = ["five.py"]\nafter_ok = ["a"]\n')
    j.py("ok.py", "pass\n")
    j.py("five.py", "raise SystemExit(5)\n")
    pipe = j.cli("pipeline", "p.toml")
    assert pipe.returncode == 0, pipe.stderr
    steps = _strict(j.cli("pipeline", "status", "p.toml", "--json").stdout)["steps"]
    j.handles["pipeline step"] = next(s["handle"] for s in steps if s["step"] == "b")
    deadline = time.monotonic() + 60
    while "RUNNING" not in j.cli("status", cancelled).stdout and time.monotonic() < deadline:
        time.sleep(0.5)
    assert j.cli("cancel", cancelled).returncode == 0
    for handle in j.handles.values():  # every job at its end before any is read
        j.cli("wait", handle, "--timeout", "240", timeout=300)
    return j


def test_every_kind_is_in_the_matrix(jobs: Jobs) -> None:
    assert set(jobs.handles) == set(KINDS)


def test_every_read_back_command_is_in_the_matrix() -> None:
    from torchhpc.cli.main import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    takes_job = {name for name, p in sub.choices.items()  # type: ignore[attr-defined]
                 if any(a.dest == "job" for a in p._actions)}
    assert takes_job == set(COMMANDS) - {"list"} | set(NOT_READERS), takes_job


def _record(jobs: Jobs, handle: str) -> tuple[Any, Any, Any]:
    status = _strict(jobs.cli("status", "--json", handle).stdout)
    events = [e for e in _strict(jobs.cli("events", "--json", handle).stdout)["events"] if e["kind"] == "end"]
    assert len(events) == 1, events
    m = re.search(r"exit (\d+)", events[0]["text"])
    end = int(m.group(1)) if m else (0 if events[0]["text"].startswith("COMPLETED") else None)
    diag = _strict(jobs.cli("diagnose", "--json", handle).stdout)
    return status, end, diag


@pytest.mark.parametrize("kind", list(KINDS))
def test_one_code_everywhere(jobs: Jobs, kind: str) -> None:
    handle = jobs.handles[kind]
    _world, code, _ran = KINDS[kind]
    status, end, diag = _record(jobs, handle)
    waited = jobs.cli("wait", handle, "--timeout", "30")
    assert (waited.returncode, status["exit_code"] or 0, end, diag["exit_code"] or 0) == (code,) * 4, (
        kind, waited.stderr, status, end, diag)


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_verdict_names_only_what_was(jobs: Jobs, kind: str) -> None:
    world, code, ran = KINDS[kind]
    diag = _strict(jobs.cli("diagnose", "--json", jobs.handles[kind]).stdout)
    for v in [diag, *diag.get("tasks", [])]:
        ranks = [*v["consequences"], *v["alike"], *([v["first"]["rank"]] if v["first"] else [])]
        assert all(0 <= r < world for r in ranks), (kind, v)
    if code == 0:
        assert diag["class"] == "none" and "completed" in diag["summary"], diag
    elif not ran:
        assert diag["first"] is None and diag["consequences"] == [] and "never started" in diag["summary"], diag
    else:
        assert diag["class"] != "none", diag


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("kind", list(KINDS))
def test_every_command_answers_every_kind(jobs: Jobs, kind: str, command: str) -> None:
    handle = jobs.handles[kind]
    argv = {"status": ["status", "--json", handle], "wait": ["wait", "--timeout", "30", handle],
            "logs": ["logs", handle], "diagnose": ["diagnose", "--json", handle],
            "events": ["events", "--json", handle], "top": ["top", "--once", "--json", handle],
            "list": ["list", "--json"]}[command]
    done = jobs.cli(*argv)
    # the program's own traceback is in its log (stdout of logs); torchhpc's own never is
    assert "Traceback" not in done.stderr + ("" if command == "logs" else done.stdout), (kind, command, done.stderr)
    if "--json" in argv:
        _strict(done.stdout)
    if command == "list":
        assert handle in {j["handle"] for j in _strict(done.stdout)}, (kind, done.stdout)


@pytest.mark.parametrize("kind", [k for k, (_w, _c, ran) in KINDS.items() if ran])
def test_logs_of_a_rank_the_job_has_not_is_an_error(jobs: Jobs, kind: str) -> None:
    done = jobs.cli("logs", jobs.handles[kind], "--rank", "7")
    assert done.returncode == 2 and done.stderr.startswith("Error: ") and "HINT: " in done.stderr, (kind, done.stderr)


# --- the same contract on the dev cluster (Slurm: srun launcher; every kind a real sbatch job) ---------

SLURM_KINDS: dict[str, tuple[int, int, bool]] = {
    "plain, completed": (2, 0, True),
    "plain, failed": (2, 3, True),
    "array task": (1, 1, True),
    "sweep task": (1, 1, True),
    "restarted, completed": (2, 0, True),
    "cancelled": (1, 143, True),
    "never started": (1, -1, False),  # its code is whatever the record says, the same everywhere
    "pipeline step": (1, 5, True),
}


@pytest.fixture(scope="module")
def slurm_jobs(slurm_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Jobs:
    j = Jobs(tmp_path_factory.mktemp("slurm-kinds"))
    j.env = {**slurm_cluster.client_env(), "HOME": str(j.root), "TORCHHPC_STATE_DIR": str(j.root / "state")}
    j.env.pop("TORCHHPC_SCHEDULER", None)
    base = ["--scheduler", "slurm", "--launcher", "srun", "--output-dir", str(j.root / "out")]

    def sub(*args: str) -> str:
        done = j.cli("run", *base, *args)
        assert done.returncode == 0, done.stdout + done.stderr
        return re.search(r"Submitted (slurm:\d+)", done.stdout).group(1)  # type: ignore[union-attr]

    j.handles["plain, completed"] = sub("-N", "1", "--nproc-per-node", "2", j.py("ok.py", "print('hello')\n"))
    j.handles["plain, failed"] = sub("-N", "1", "--nproc-per-node", "2", j.py("fail.py", "import os, sys\n"
                                     "sys.exit(3) if os.environ['RANK'] == '1' else None\n"))
    j.handles["array task"] = sub("--array", "0-1", j.py("task.py", "import os\n"
                                  "if os.environ['TORCHHPC_ARRAY_INDEX'] == '0':\n    raise ValueError('bad')\n"))
    j.py("task_x.py", "import sys\nif sys.argv[1] == '0':\n    raise ValueError('bad x')\n")
    sweep = j.cli("sweep", *base[:4], "--grid", "x=0,1", "--output-dir", str(j.root / "sw"), "--", "task_x.py", "{x}")
    assert sweep.returncode == 0, sweep.stdout + sweep.stderr
    j.handles["sweep task"] = json.loads((j.root / "sw" / "sweep.json").read_text())["handle"]
    j.handles["restarted, completed"] = sub("-N", "1", "--nproc-per-node", "2", "--max-restarts", "1", "--hang-timeout",
                                            "10", j.py("restart.py", (
                                                "import os, time\nprint('attempt', os.environ['TORCHHPC_RESTART_COUNT'], "
                                                "flush=True)\nif os.environ['TORCHHPC_RESTART_COUNT'] == '0':\n"
                                                "    time.sleep(600)\n")))
    cancelled = sub("-N", "1", j.py("sleep.py", "import time\nprint('up', flush=True)\ntime.sleep(600)\n"))
    j.handles["cancelled"] = cancelled
    j.handles["never started"] = sub("--after-ok", j.handles["plain, failed"], "ok.py")
    (j.root / "p.toml").write_text('[defaults]\nscheduler = "slurm"\nlauncher = "srun"\n'
                                   '[steps.a]\nprogram = ["ok.py"]\n[steps.b]\nprogram = ["five.py"]\nafter_ok = ["a"]\n')
    j.py("five.py", "raise SystemExit(5)\n")
    pipe = j.cli("pipeline", "p.toml")
    assert pipe.returncode == 0, pipe.stdout + pipe.stderr
    steps = _strict(j.cli("pipeline", "status", "p.toml", "--json").stdout)["steps"]
    j.handles["pipeline step"] = next(s["handle"] for s in steps if s["step"] == "b")
    deadline = time.monotonic() + 120
    while "RUNNING" not in j.cli("status", cancelled).stdout and time.monotonic() < deadline:
        time.sleep(0.5)
    assert j.cli("cancel", cancelled).returncode == 0
    for handle in j.handles.values():
        j.cli("wait", handle, "--timeout", "300", timeout=360)
    return j


@pytest.mark.cluster("slurm")
@pytest.mark.parametrize("kind", list(SLURM_KINDS))
def test_one_code_everywhere_on_slurm(slurm_jobs: Jobs, kind: str) -> None:
    handle = slurm_jobs.handles[kind]
    _world, code, _ran = SLURM_KINDS[kind]
    status, end, diag = _record(slurm_jobs, handle)
    waited = slurm_jobs.cli("wait", handle, "--timeout", "60")
    got = (waited.returncode, status["exit_code"] or 0, end if end is not None else 0, diag["exit_code"] or 0)
    assert len(set(got)) == 1 and (code < 0 or got[0] == code), (kind, got, waited.stderr, status, diag)


@pytest.mark.cluster("slurm")
@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("kind", list(SLURM_KINDS))
def test_every_command_answers_every_kind_on_slurm(slurm_jobs: Jobs, kind: str, command: str) -> None:
    handle = slurm_jobs.handles[kind]
    argv = {"status": ["status", "--json", handle], "wait": ["wait", "--timeout", "60", handle],
            "logs": ["logs", handle], "diagnose": ["diagnose", "--json", handle],
            "events": ["events", "--json", handle], "top": ["top", "--once", "--json", handle],
            "list": ["list", "-s", "slurm", "--json"]}[command]
    done = slurm_jobs.cli(*argv)
    assert "Traceback" not in done.stderr + ("" if command == "logs" else done.stdout), (kind, command, done.stderr)
    if "--json" in argv:
        _strict(done.stdout)


@pytest.mark.cluster("slurm")
@pytest.mark.parametrize("kind", list(SLURM_KINDS))
def test_the_verdict_names_only_what_was_on_slurm(slurm_jobs: Jobs, kind: str) -> None:
    world, code, ran = SLURM_KINDS[kind]
    diag = _strict(slurm_jobs.cli("diagnose", "--json", slurm_jobs.handles[kind]).stdout)
    for v in [diag, *diag.get("tasks", [])]:
        ranks = [*v["consequences"], *v["alike"], *([v["first"]["rank"]] if v["first"] and v["first"]["rank"] >= 0 else [])]
        assert all(0 <= r < world for r in ranks), (kind, v)
    if code == 0:
        assert diag["class"] == "none", diag
    elif not ran:
        assert diag["first"] is None and diag["consequences"] == [], diag
    else:
        assert diag["class"] != "none", diag
