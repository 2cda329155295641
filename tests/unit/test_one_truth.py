"""Issue 50, items 4 to 7: one error path, every flag honoured or refused, profiles that do not
block a local run, a missing container runtime said in one line. Each case is what a newcomer
typed in one afternoon; each failed before (a traceback, a flag dropped in silence, a wait
forever, a 300-line error). Through the real CLI (``python -m torchhpc``), with no user config.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.usefixtures("clean_user_env")


def cli(*args: str, env: dict[str, str] | None = None, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "torchhpc", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})}, cwd=cwd)


def one_error(done: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    """``Error: ...`` (with each of ``words``) and a HINT, exit ``code``, no traceback."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr and lines and lines[0].startswith("Error: "), done.stderr
    assert lines[-1].startswith("HINT: "), done.stderr
    for w in words:
        assert w in done.stderr, (w, done.stderr)


@pytest.fixture
def a_job(tmp_path: Path) -> str:
    done = cli("run", "-n", "1", "--", sys.executable, "-c", "pass")
    assert done.returncode == 0, done.stderr
    return cli("list", "--last").stdout.split()[0]


# --- 4: no traceback, and --json errors are JSON -------------------------------------------------


@pytest.mark.parametrize(("plot", "said"), [("/nonexistent/dir/x.png", "does not exist"), ("out.txt", "not an image")])
def test_events_plot_to_a_bad_path_is_one_line(a_job: str, plot: str, said: str) -> None:
    one_error(cli("events", a_job, "--plot", plot), 2, "--plot", said)


def test_container_recipe_to_an_unwritable_place_is_one_line() -> None:
    one_error(cli("container", "recipe", "--base", "nvcr.io/nvidia/pytorch:24.03-py3", "--output", "/proc/x"),
              2, "--output /proc/x")


@pytest.mark.parametrize("argv", [["run", "--json", "--nodes", "two", "x.py"], ["run", "--json", "--schedular", "slurm", "x.py"],
                                  ["status", "--json"]])
def test_json_errors_are_json_even_from_the_parser(argv: list[str]) -> None:
    done = cli(*argv)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    err = json.loads(done.stdout)
    assert err["exit_code"] == 2 and err["error"] and err["hint"].startswith("usage: ")


def test_a_parser_error_has_the_clis_two_lines() -> None:
    one_error(cli("run", "--nodse", "2", "x.py"), 2, "--nodse", "did you mean --nodes?")


# --- 5: every flag honoured or refused ------------------------------------------------------------


@pytest.mark.parametrize("flag", [["--partition", "acc"], ["--account", "a"], ["--qos", "q"], ["--queue", "q"],
                                  ["--exclude", "node1"], ["--opt", "foo=1"]])
def test_a_local_run_refuses_what_it_has_not(flag: list[str]) -> None:
    one_error(cli("run", "-n", "1", *flag, "--dry-run", "examples/pi.py"), 2, flag[0], "the local scheduler has no")


def test_slurm_queue_is_named_as_typed_with_the_partition_hint() -> None:
    done = cli("run", "--scheduler", "slurm", "--queue", "q", "--dry-run", "examples/pi.py")
    one_error(done, 2, "--queue q", "--partition q")
    assert "(from --opt)" not in done.stderr


def test_a_config_default_a_scheduler_lacks_is_not_applied(tmp_path: Path) -> None:
    (tmp_path / ".config" / "torchhpc").mkdir(parents=True)
    (tmp_path / ".config" / "torchhpc" / "config.toml").write_text('partition = "acc"\n')
    done = cli("run", "--scheduler", "pbs", "--dry-run", "examples/pi.py")
    assert done.returncode == 0, done.stderr
    show = cli("config", "show", env={"TORCHHPC_SCHEDULER": "pbs"})
    assert "not applied: the pbs scheduler has none (partition acc" in show.stdout


def test_output_dir_is_honoured_by_a_local_job(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    done = cli("run", "-n", "2", "--output-dir", str(out), "--", sys.executable, "-c", "print('hi')")
    assert done.returncode == 0, done.stderr
    (job,) = list(out.iterdir())
    assert (job / "output.log").read_text().count("hi") == 2
    handle = cli("list", "--last").stdout.split()[0]
    assert cli("logs", handle).stdout.count("hi") == 2


def test_time_as_mm_ss_is_refused_with_both_readings() -> None:
    one_error(cli("run", "--scheduler", "slurm", "--time", "1:30", "--dry-run", "examples/pi.py"), 2,
              "ambiguous", "01:30:00", "00:01:30")


@pytest.mark.parametrize("off", ["off", "0"])
def test_hang_timeout_off_turns_the_watch_off_over_the_variable(off: str) -> None:
    done = cli("run", "-n", "1", "--hang-timeout", off, "--", sys.executable, "-c", "raise SystemExit(3)",
               env={"TORCHHPC_HANG_TIMEOUT": "30"})
    assert done.returncode == 3, done.stderr  # the program's own code: no watch, so no class code (95)


def test_sweep_refuses_array_beside_grid() -> None:
    one_error(cli("sweep", "--grid", "lr=0.1,0.2", "--array", "0-3", "--dry-run", "--", "examples/pi.py"), 2,
              "--array 0-3", "--grid")


@pytest.mark.parametrize("flag", [["--array", "0-3"], ["--requeue", "--time", "01:00:00"], ["--max-restarts", "2"],
                                  ["--spares", "1"]])
def test_shell_refuses_what_only_a_batch_job_has(flag: list[str]) -> None:
    one_error(cli("shell", "--scheduler", "slurm", "--nodes", "1", "--dry-run", *flag), 2, flag[0])


# --- 6: a site profile in config.toml -------------------------------------------------------------


@pytest.fixture
def mn5_configured(tmp_path: Path) -> Path:
    d = tmp_path / ".config" / "torchhpc"
    d.mkdir(parents=True)
    (d / "config.toml").write_text('profile = "mn5"\ntime = "01:00:00"\n')
    return d


def test_a_profile_asks_a_local_run_for_nothing(mn5_configured: Path) -> None:
    done = cli("run", "--scheduler", "local", "--no-container", "-n", "1", "--", sys.executable, "-c", "pass")
    assert done.returncode == 0, done.stderr


def test_all_missing_requirements_in_one_error(mn5_configured: Path) -> None:
    done = cli("run", "--dry-run", "examples/pi.py")
    one_error(done, 2, "--account", "--qos", "--profile none")
    assert "--time" not in done.stderr.splitlines()[0]  # time is set in the file


@pytest.mark.parametrize("none", ["none", ""])
def test_profile_none_clears_a_configured_profile(mn5_configured: Path, none: str) -> None:
    done = cli("run", "--profile", none, "--scheduler", "slurm", "--dry-run", "examples/pi.py")
    assert done.returncode == 0, done.stderr
    assert "singularity" not in done.stdout


# --- 7: a missing container runtime ---------------------------------------------------------------


def test_a_missing_runtime_is_one_line_before_any_rank(tmp_path: Path) -> None:
    env = {"PATH": str(Path(sys.executable).parent)}  # the venv alone: no container runtime on it
    done = cli("run", "--container", "img.sif", "-n", "1", "examples/pi.py", env=env)
    one_error(done, 2, "--runtime apptainer", "not on PATH", "no container runtime is installed here")
    assert len(done.stderr.splitlines()) == 2
    assert "no" in cli("list").stderr or cli("list").stdout.strip() == ""  # no record was made
