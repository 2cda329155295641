"""Issue 64: one truth for every kind of job. Each test is an item a new user met on 7ceb4e7, read
back through the real CLI (``python -m torchhpc``) or the pure readers, with no user config.

The local array's log is recorded as the local scheduler writes it (``[task I] [rankN]: ...`` and
each task's own end line, schedulers/local/array.py); torch's own ``[rankN]: `` prefix before a
traceback raised after ``init_process_group`` is as torch 2.13 prints it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from torchhpc.diagnose.evidence import Evidence
from torchhpc.diagnose.readback import TaskVerdicts, read_back
from torchhpc.errors import UsageError
from torchhpc.jobdir.logs import TASK_END, parse_line, task_text
from torchhpc.jobdir.tracebacks import first_tracebacks

ARRAY_LOG = """\
[task 0] [rank0]: starting
[task 0] [rank0]: Traceback (most recent call last):
[task 0] [rank0]:   File "/work/bad.py", line 3, in <module>
[task 0] [rank0]:     raise ValueError("bad value here")
[task 0] [rank0]: ValueError: bad value here
[task 0] torchhpc: task 0 ended FAILED, exit 1, after 0.4 s: rank 0 exited with code 1; no other rank was running
[task 1] [rank0]: starting
[task 1] [rank0]: done
[task 1] torchhpc: task 1 ended COMPLETED, exit 0, after 0.3 s
torchhpc: 1 of 2 array tasks failed: 0 (exit 1)
"""


def cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "torchhpc", *args], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ), cwd=cwd)


# --- 1: a task's lines read through its [task I] prefix ------------------------------------------------


def test_a_task_line_names_its_task_and_rank() -> None:
    ln = parse_line("[task 3] [rank1]: hello", "local")
    assert (ln.task, ln.rank, ln.text) == (3, 1, "hello")
    assert ln.show() == "[task 3] [rank1]: hello"
    end = parse_line("[task 3] " + TASK_END.format(index=3, state="FAILED", code=2, s=1.0, reason=": x"), "local")
    assert (end.task, end.rank) == (3, None)


def test_each_tasks_traceback_is_found_under_its_task() -> None:
    tbs = first_tracebacks([parse_line(x, "local") for x in ARRAY_LOG.splitlines()])
    assert [r for r, _ in tbs.by_rank] == [0] and tbs.tasks == (0,)
    assert tbs.by_rank[0][1][-1] == "ValueError: bad value here"
    assert "=== task 0 rank 0 ===" in tbs.render()


def test_torchs_own_rank_prefix_is_read_through() -> None:
    """Every traceback after init_process_group carries torch's ``[rankN]: `` (issue 70, item 4)."""
    texts = ["[rank1]: Traceback (most recent call last):", '[rank1]:   File "/w/x.py", line 3, in <module>',
             "[rank1]:     boom()", "[rank1]: RuntimeError: boom"]
    lines = [parse_line(f"1: {t}", "srun") for t in texts]
    assert all(ln.rank == 1 for ln in lines)
    tbs = first_tracebacks(lines)
    assert tbs.by_rank and tbs.by_rank[0][1][-1] == "RuntimeError: boom"


def test_one_tasks_log_and_one_rank_of_it() -> None:
    assert "done" not in task_text(ARRAY_LOG, 0) and "bad value" in task_text(ARRAY_LOG, 0)
    assert task_text(ARRAY_LOG, 1, 0) == "starting\ndone\n"
    assert task_text(ARRAY_LOG, 1, rank=1) == ""  # a rank the task does not have: nothing, not task 0's lines
    assert task_text(ARRAY_LOG, None, 0).splitlines()[0] == "[task 0] starting"


def test_a_verdict_per_task_from_its_own_lines() -> None:
    lines = [parse_line(x, "local") for x in ARRAY_LOG.splitlines()]
    v = read_back(Evidence(lines=lines, state="FAILED", exit_code=1, job="local:abc", local=True, nproc_per_node=1,
                           reason="1 of 2 array tasks failed: 0 (exit 1)"))
    assert isinstance(v, TaskVerdicts)
    verdicts = dict(v.tasks)
    assert verdicts[0].klass == "user-exception" and verdicts[0].first is not None
    assert verdicts[0].first.error == "ValueError: bad value here" and verdicts[0].consequences == ()
    assert verdicts[1].ok
    text = v.render()
    assert text.startswith("task 0: diagnosis: user-exception") and "consequence" not in text
    assert "task 1 completed" in text
    json.dumps(v.to_json(), allow_nan=False)  # strict JSON: no Infinity anywhere (item 2)


# --- 3 and 4: the record wins; a job that never started has no rank verdict ----------------------------


def test_a_job_completed_after_a_restart_has_no_failure() -> None:
    hang = {"culprits": [1], "waiting": [0], "stacks": [], "quiet_s": 20}
    v = read_back(Evidence(state="COMPLETED", exit_code=0, hang=hang, job="local:x",
                           attempts=[{"attempt": 0, "class": "hang"}, {"attempt": 1, "class": ""}]))
    assert v.ok and "completed after 1 restart" in v.summary and "hang" in v.summary
    assert "(attempt 0 ended hang)" in v.summary, v.summary  # numbered as status and events number it


def test_events_json_carries_the_records_exit_code() -> None:
    """README: status --json, events --json and diagnose --json carry the record's code in exit_code."""
    from torchhpc.diagnose.events import timeline
    from torchhpc.schedulers.times import JobTimes

    times = JobTimes(submit=100.0, start=101.0, end=105.0, state="FAILED", exit_code=3, source="record")
    out = json.loads(json.dumps(timeline("local:x", times, [], now=200.0).to_json()))
    assert out["state"] == "FAILED" and out["exit_code"] == 3, out


def test_a_job_that_never_started_gets_no_rank_verdict() -> None:
    from torchhpc.diagnose.readback import printable

    v = read_back(Evidence(state="FAILED", exit_code=1, job="local:x", local=True, nproc_per_node=1,
                           reason="DependencyNeverSatisfied: after-ok local:y: FAILED (exit 1): never satisfied"))
    assert v.first is None and v.consequences == () and "never started" in v.summary
    assert printable(v) is None  # nothing printed between Error: and HINT:


# --- 7, 8, 12, 13, 15: input read as meant, refused before anything runs --------------------------------


@pytest.mark.parametrize(("given", "argv"), [
    ("examples/pi.py", ["examples/pi.py"]),
    ("examples/pi.py --steps 5", ["examples/pi.py", "--steps", "5"]),
    (Path("examples/pi.py"), ["examples/pi.py"]),
])
def test_job_takes_a_string_as_one_command_line(given: object, argv: list[str]) -> None:
    from torchhpc.job import _argv

    assert _argv(given) == argv  # type: ignore[arg-type]


def test_job_refuses_an_empty_string() -> None:
    from torchhpc.job import _argv

    with pytest.raises(UsageError):
        _argv("")


@pytest.mark.usefixtures("clean_user_env")
def test_a_local_dry_run_refuses_a_missing_program(tmp_path: Path) -> None:
    done = cli("run", "--dry-run", "nosuch.py", cwd=tmp_path)
    assert done.returncode == 2 and "does not exist" in done.stderr and "Traceback" not in done.stderr
    pipe = tmp_path / "p.toml"
    pipe.write_text('[steps.a]\nprogram = ["nosuch.py"]\n')
    done = cli("pipeline", str(pipe), "--dry-run", cwd=tmp_path)
    assert done.returncode == 2 and "step a" in done.stderr and "nosuch.py" in done.stderr, done.stderr


@pytest.mark.usefixtures("clean_user_env")
def test_a_pipeline_key_refused_by_its_scheduler_is_named_as_written(tmp_path: Path) -> None:
    (tmp_path / "ok.py").write_text("pass\n")
    pipe = tmp_path / "p.toml"
    pipe.write_text('[steps.a]\nprogram = ["ok.py"]\ntime = 90\n')
    done = cli("pipeline", str(pipe), "--dry-run", cwd=tmp_path)
    assert done.returncode == 2 and f"{pipe}: step a: time = 90:" in done.stderr, done.stderr


def test_a_pipeline_dry_run_opens_with_its_graph(tmp_path: Path) -> None:
    (tmp_path / "ok.py").write_text("pass\n")
    pipe = tmp_path / "p.toml"
    pipe.write_text('[steps.a]\nprogram = ["ok.py"]\n[steps.b]\nprogram = ["ok.py"]\nafter_ok = ["a"]\n')
    done = cli("pipeline", str(pipe), "--dry-run", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[:3] == ["# pipeline p: 2 steps", "#   a on local, first", "#   b on local, after a (ok)"]


@pytest.mark.parametrize(("time", "said"), [
    ("99:99", "write HH:MM:SS: 4-04:39:00 for 99 h 99 min, or 01:40:39 for 99 min 99 s"),
    ("1-25:00:00", "write 2-01:00:00"),
])
def test_a_time_hint_is_itself_valid(time: str, said: str) -> None:
    from torchhpc.core.units import parse_walltime
    from torchhpc.errors import SpecError

    with pytest.raises(SpecError) as e:
        parse_walltime(time)
    assert e.value.hint == said
    for suggested in [w.rstrip(",") for w in said.split() if w[:1].isdigit()]:
        parse_walltime(suggested)  # every suggestion is accepted as written


@pytest.mark.usefixtures("clean_user_env")
def test_rank0_only_with_background_is_refused() -> None:
    done = cli("run", "--rank0-only", "--background", "examples/pi.py")
    assert done.returncode == 2 and "--rank0-only with --background" in done.stderr


# --- 10: a subcommand's switch before the subcommand ----------------------------------------------------


@pytest.mark.usefixtures("clean_user_env")
@pytest.mark.parametrize("argv", [["config", "--json", "show"], ["config", "show", "--json"]])
def test_config_json_show_either_way(argv: list[str]) -> None:
    done = cli(*argv)
    assert done.returncode == 0, done.stderr
    assert "flight_recorder" in json.loads(done.stdout)


# --- 2, 6, 9, 14, 16: read back a real local job ------------------------------------------------------


@pytest.mark.usefixtures("clean_user_env")
def test_a_failed_local_array_reads_back_per_task(tmp_path: Path) -> None:
    prog = tmp_path / "bad.py"
    prog.write_text("import os, sys\nprint('index', os.environ['TORCHHPC_ARRAY_INDEX'])\n"
                    "sys.exit(0) if os.environ['TORCHHPC_ARRAY_INDEX'] == '1' else None\nraise ValueError('bad value')\n")
    ran = cli("run", "--array", "0-1", "--background", str(prog), cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    last = cli("list", "--last", cwd=tmp_path)
    handle = last.stdout.strip()
    assert last.returncode == 0 and handle.startswith("local:") and " " not in handle, last.stdout  # item 6
    assert cli("wait", handle, "--timeout", "100", cwd=tmp_path).returncode == 1
    diag = cli("diagnose", handle, "--json", cwd=tmp_path)
    verdict = json.loads(diag.stdout, parse_constant=lambda c: pytest.fail(f"not strict JSON: {c}"))  # item 2
    assert verdict["class"] == "user-exception" and verdict["consequences"] == []
    assert [t["task"] for t in verdict["tasks"]] == [0, 1] and verdict["tasks"][1]["class"] == "none"
    errors = cli("logs", handle, "--errors", cwd=tmp_path)
    assert "=== task 0 rank 0 ===" in errors.stdout and "ValueError: bad value" in errors.stdout, errors.stderr
    rank0 = cli("logs", handle, "--rank", "0", cwd=tmp_path)
    assert "[task 1] index 1" in rank0.stdout and "[task 0] index 0" in rank0.stdout, rank0.stdout
    assert cli("logs", handle, "--rank", "5", cwd=tmp_path).returncode == 2  # no such rank: an error, not ""
    status = json.loads(cli("status", "--json", handle, cwd=tmp_path).stdout)
    assert status["log_dir"] and os.path.isdir(status["log_dir"])  # item 16
    assert cli("wait", "local:deadbeef00", cwd=tmp_path).returncode == 2  # item 14: a mistyped handle is input


# --- 5: a hang's verdict says where each rank is and where every stack is kept -------------------------


def test_a_hang_verdict_names_each_ranks_place_and_the_stack_file() -> None:
    stacks = [{"rank": r, "host": "localhost", "pid": 10 + r, "cpu_s": 0.0, "error": "",
               "frames": [["<module>", "/w/sl.py", 3]]} for r in range(2)]
    hang = {"quiet_s": 6, "culprits": [], "waiting": [], "stacks": stacks, "note": "x", "flight": []}
    v = read_back(Evidence(hang=hang, state="CANCELLED", exit_code=81, job="local:x", job_dir="/jobs/x"))
    assert v.klass == "hang" and "stacks above" not in v.render()
    assert "ranks 0-1 at /w/sl.py:3" in v.next_step and "/jobs/x/hang.json" in v.next_step, v.next_step


# --- docs that disagreed: config show offers only what the file takes, and the defaults a job gets --------


@pytest.mark.usefixtures("clean_user_env")
def test_config_show_marks_what_the_file_takes_and_shows_real_defaults() -> None:
    import re

    from torchhpc.config import CONFIG_KEYS

    shown = json.loads(cli("config", "show", "--json").stdout)
    assert {k for k, v in shown.items() if v["config_key"]} == set(CONFIG_KEYS)
    assert "remote" in shown
    boot = (REPO / "src/torchhpc/boot/sitecustomize.py").read_text()
    default = re.search(r'^FR_DEFAULT = "(\d+)"', boot, re.M)
    assert default and shown["flight_recorder"]["value"] == default.group(1)


# --- wording: errors in the words the user typed, each with a HINT ---------------------------------------


@pytest.mark.usefixtures("clean_user_env")
@pytest.mark.parametrize(("argv", "env", "said"), [
    (["run", "-n", "two", "examples/pi.py"], {}, "-n 'two' is not a whole number"),
    (["run", "-n", "0", "examples/pi.py"], {}, "--nproc-per-node=0 must be at least 1"),
    (["run", "--env", "FOO", "--dry-run", "examples/pi.py"], {}, "--env 'FOO' is not NAME=VALUE"),
    (["run", "--dry-run", "examples/pi.py"], {"TORCHHPC_SCHEDULER": "slurmm"}, "$TORCHHPC_SCHEDULER='slurmm'"),
    (["run", "--dry-run", "examples/pi.py"], {"TORCHHPC_PROFILE": "mn55"}, "$TORCHHPC_PROFILE='mn55'"),
])
def test_an_error_names_what_was_typed_and_hints(argv: list[str], env: dict[str, str], said: str) -> None:
    done = subprocess.run([sys.executable, "-m", "torchhpc", *argv], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env}, cwd=REPO)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and lines[0].startswith("Error: ") and said in lines[0], done.stderr
    assert lines[-1].startswith("HINT: ") and "invalid int value" not in done.stderr, done.stderr


def test_help_command_and_a_clean_dir() -> None:
    done = cli("help", "logs")
    assert done.returncode == 0 and done.stdout.startswith("usage: torchhpc logs"), done.stderr
    import torchhpc

    assert dir(torchhpc) == sorted(torchhpc.__all__)  # no Any, annotations or _LAZY


def test_job_keywords_are_named_in_a_schedulers_refusal() -> None:
    from torchhpc.errors import SpecError
    from torchhpc.job import Job

    with pytest.raises(SpecError) as e:
        Job(["examples/pi.py"], time="00:10:00").render()
    assert e.value.message.startswith("time=00:10:00: the local scheduler has no wall-time limit"), e.value.message


def test_events_of_a_failed_job_say_so_once_and_qualify_its_ettr(tmp_path: Path) -> None:
    from torchhpc.diagnose.events import timeline
    from torchhpc.schedulers.times import JobTimes

    times = JobTimes(submit=100.0, start=101.0, end=105.0, state="FAILED", exit_code=4, source="record")
    text = timeline("local:x", times, [], now=200.0).render()
    lines = text.splitlines()
    assert "state now" not in text and sum("FAILED" in ln for ln in lines[:-1]) == 1, text  # the end row only
    assert lines[-1].endswith("(the job ended FAILED: its work counts only as far as it checkpointed)"), lines[-1]


def test_no_seed_number_in_what_users_see() -> None:
    """Our source documents are "seeds" among ourselves; a user reads the guide's name (issue 69)."""
    import re

    for path in (REPO / "src" / "torchhpc").rglob("*.py"):
        assert not re.search(r"seed 00\d", path.read_text()), path


def test_the_python_api_takes_the_clis_slurm_target() -> None:
    """Issue 70 item 7: Job() registers the dev-cluster provider the CLI registers, so Job.submit() and
    Executor reach a running dev cluster as `torchhpc run --scheduler slurm` does (asked at the first command)."""
    from torchhpc.config import _devcluster_env
    from torchhpc.job import Job
    from torchhpc.schedulers import SITE_ENV

    Job(["examples/pi.py"], scheduler="slurm", nodes=1)
    assert _devcluster_env in SITE_ENV.get("slurm", [])


def test_env_explain_outside_a_job_says_so_first(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "PMI_", "PBS_", "TORCHELASTIC",
                                                                   "RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "PET_"))}
    done = subprocess.run([sys.executable, "-m", "torchhpc", "env", "--explain"], capture_output=True, text=True,
                          timeout=60, env=env, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.startswith("not inside a distributed job"), done.stdout[:300]


@pytest.mark.usefixtures("clean_user_env")
def test_a_function_tasks_logs_are_its_own(tmp_path: Path) -> None:
    """Item 1: FunctionJob.logs() of task 0 had task 1's lines too, and logs(rank=1) was "" (a local array's
    tasks share one log, each line behind its [task I]). The log is the local scheduler's own file."""
    from torchhpc.functions.executor import FunctionJob
    from torchhpc.job import JobHandle
    from torchhpc.schedulers import get_scheduler
    from torchhpc.schedulers.local.jobs import job_dir

    d = job_dir("abc123")
    d.mkdir(parents=True)
    (d / "record.json").write_text(json.dumps({"scheduler": "local", "job_id": "abc123", "state": "FAILED",
                                               "exit_code": 1, "submitted": 1.0, "ended": 2.0, "pid": 0}))
    (d / "output.log").write_text(ARRAY_LOG.replace("[task 1] [rank0]: done", "[task 1] [rank1]: done"))
    handle = JobHandle(get_scheduler("local"), "abc123")
    first, second = (FunctionJob(handle, None, 2, task=t) for t in (0, 1))  # type: ignore[arg-type]
    assert "bad value here" in first.logs() and "done" not in first.logs()
    assert second.logs(rank=1) == "done\n" and first.logs(rank=1) == ""


@pytest.mark.usefixtures("clean_user_env")
@pytest.mark.parametrize("command", [["status"], ["wait"], ["logs"], ["logs", "--rank", "0"], ["diagnose"], ["events"]])
def test_a_local_array_has_no_task_handles(command: list[str]) -> None:
    """`status local:ID_1` said "no job" while `logs local:ID_1` (and `local:ID_5` of a 3-task array) printed
    every task's lines with exit 0, and `diagnose local:ID_1` gave the array's verdict under that name."""
    from torchhpc.jobdir.record import record_path
    from torchhpc.schedulers.local.jobs import job_dir

    d = job_dir("abc124")
    d.mkdir(parents=True)
    (d / "record.json").write_text(json.dumps({"scheduler": "local", "job_id": "abc124", "state": "FAILED",
                                               "exit_code": 1, "submitted": 1.0, "ended": 2.0, "pid": 0}))
    (d / "output.log").write_text(ARRAY_LOG)
    record_path("local", "abc124").parent.mkdir(parents=True, exist_ok=True)  # the handle's record, as run writes it
    record_path("local", "abc124").write_text(json.dumps({"submitted": 1.0, "name": "bad", "nproc_per_node": 1}))
    done = cli(command[0], "local:abc124_5", *command[1:])
    assert done.returncode == 2 and done.stdout == "", (done.stdout, done.stderr)
    err = done.stderr.splitlines()
    assert err[0].startswith("Error: no job local:abc124_5") and err[1].startswith("HINT: a local job array's tasks"), err
    assert "Traceback" not in done.stderr


@pytest.mark.usefixtures("clean_user_env")
def test_a_foreground_run_that_never_started_has_no_start(tmp_path: Path) -> None:
    """A foreground `run --after-ok` of a failed job: `events` showed a `start localhost` row (the record's start,
    written before the wait), where the same job in the background has none."""
    prog = tmp_path / "exit3.py"
    prog.write_text("raise SystemExit(3)\n")
    assert cli("run", str(prog), cwd=tmp_path).returncode == 3
    failed = cli("list", "--last", cwd=tmp_path).stdout.strip()
    ran = cli("run", "--after-ok", failed, str(prog), cwd=tmp_path)
    assert ran.returncode == 1 and "HINT:" in ran.stderr, ran.stderr
    handle = cli("list", "--last", cwd=tmp_path).stdout.strip()
    assert handle != failed
    ev = json.loads(cli("events", handle, "--json", cwd=tmp_path).stdout)
    assert [e["kind"] for e in ev["events"]] == ["submit", "end"], ev["events"]
    assert ev["state"] == "CANCELLED" and ev["exit_code"] == 1, ev


@pytest.mark.usefixtures("clean_user_env")
def test_a_foreground_array_keeps_a_record_to_read_back(tmp_path: Path) -> None:
    """A foreground `run --array` printed its tasks and kept no record: `list --last` named the job before it."""
    prog = tmp_path / "t.py"
    prog.write_text("import os\nif os.environ['TORCHHPC_ARRAY_INDEX'] == '1':\n    raise SystemExit(4)\nprint('ok')\n")
    ran = cli("run", "--array", "0-1", str(prog), cwd=tmp_path)
    assert ran.returncode == 4 and "[task 0] [rank0]: ok" in ran.stdout, ran.stdout + ran.stderr
    handle = cli("list", "--last", cwd=tmp_path).stdout.strip()
    status = json.loads(cli("status", "--json", handle, cwd=tmp_path).stdout)
    assert (status["state"], status["exit_code"]) == ("FAILED", 4), status
    verdict = json.loads(cli("diagnose", "--json", handle, cwd=tmp_path).stdout)
    assert [t["task"] for t in verdict["tasks"]] == [0, 1] and verdict["tasks"][0]["class"] == "none", verdict
    assert "[task 0] ok" in cli("logs", handle, "--rank", "0", cwd=tmp_path).stdout


@pytest.mark.usefixtures("clean_user_env")
def test_sweep_and_pipeline_status_after_prune(tmp_path: Path) -> None:
    """Item 9: after `list --prune 0` a sweep reads its tasks from its own directory, and a pipeline whose steps'
    records are gone says so and exits 1 (it showed UNKNOWN with 0)."""
    (tmp_path / "t.py").write_text("import sys\nraise SystemExit(0 if sys.argv[1] == '1' else 3)\n")
    done = cli("sweep", "--grid", "x=1,2", "--output-dir", "sw", "--wait", "--", sys.executable, "t.py", "{x}",
               cwd=tmp_path)
    assert done.returncode != 0, done.stdout + done.stderr  # one task exits 3
    (tmp_path / "p.toml").write_text('[steps.a]\nprogram = ["t.py", "1"]\n')
    assert cli("pipeline", "p.toml", "--wait", cwd=tmp_path).returncode == 0
    assert cli("list", "--prune", "0", cwd=tmp_path).returncode == 0
    rows = json.loads(cli("sweep", "status", "sw", "--json", cwd=tmp_path).stdout)
    assert [(r["x"], r["state"], r["exit_code"]) for r in rows] == [("1", "COMPLETED", 0), ("2", "FAILED", 3)], rows
    gone = cli("pipeline", "status", "p.toml", cwd=tmp_path)
    assert gone.returncode == 1 and "record gone" in gone.stdout, gone.stdout + gone.stderr
