"""``torchhpc env`` / ``env --explain`` / ``env --export`` / ``exec``, and export()'s no-clobber rule.

The CLI reads the real process environment, so each test starts from one
scrubbed of launcher variables (the suite itself may run inside a job).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import HOSTILE, PYTHON, REPO
from torchhpc.cli.main import main
from torchhpc.env import PRIORITY, conflicts, detect, export

PREFIXES = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "PBS_", "MV2_", "MPI_", "PALS_", "PET_", "RUNAI_", "KUBERNETES_")
NAMES = {v for d, _ in PRIORITY for v in d.variables} | {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "GROUP_WORLD_SIZE",
    "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE",
}
STEP = {
    "SLURM_JOB_ID": "4242",
    "SLURM_JOB_NODELIST": "gpu[01-02]",
    "SLURM_STEP_NODELIST": "gpu[01-02]",
    "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    "SLURM_PROCID": "3",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
}


def scrubbed(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not (k.startswith(PREFIXES) or k in NAMES)}
    env.update(extra or {})
    return env


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    for name in list(os.environ):
        if name.startswith(PREFIXES) or name in NAMES:
            monkeypatch.delenv(name)
    yield monkeypatch


def test_export_never_overwrites_and_returns_only_additions() -> None:
    dist_env = detect(STEP)
    environ = {"MASTER_PORT": "29999", "RANK": "3", "PATH": "/bin"}
    added = export(dist_env, environ)
    assert environ["MASTER_PORT"] == "29999"  # the user's value stays
    assert "MASTER_PORT" not in added and "RANK" not in added
    assert added["LOCAL_RANK"] == "1" and added["MASTER_ADDR"] == "gpu01"
    assert environ["WORLD_SIZE"] == "4" and environ["GROUP_RANK"] == environ["NODE_RANK"] == "1"
    assert conflicts(dist_env, environ) == {"MASTER_PORT": ("29999", "14242")}
    assert export(dist_env, environ) == {}  # idempotent


def test_detect_and_explain_do_not_write_the_environment(clean_env: pytest.MonkeyPatch) -> None:
    for k, v in STEP.items():
        clean_env.setenv(k, v)
    before = dict(os.environ)
    assert main(["env", "--explain"]) == 0
    assert main(["env"]) == 0
    assert dict(os.environ) == before


def test_env_json(clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for k, v in STEP.items():
        clean_env.setenv(k, v)
    assert main(["env", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["source"] == "slurm" and data["rank"] == 3 and data["world_size"] == 4
    assert data["master_addr"] == "gpu01" and data["master_port"] == 14242


def test_env_table(clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    assert "source            local" in out and "world_size        1" in out


def test_explain_lists_every_detector_and_marks_one(clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for k, v in STEP.items():
        clean_env.setenv(k, v)
    assert main(["env", "--explain"]) == 0
    out = capsys.readouterr().out
    for detector, _ in PRIORITY:
        assert f" {detector.name} " in out
    assert out.count("chosen") == 1
    assert "slurm     chosen" in out
    assert "rank 3/4" in out
    assert "read    SLURM_JOB_ID=4242, SLURM_JOB_NODELIST=gpu[01-02], SLURM_PROCID=3" in out


def test_explain_shows_the_error_then_fails(clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    clean_env.setenv("RANK", "x")
    clean_env.setenv("WORLD_SIZE", "2")
    clean_env.setenv("LOCAL_RANK", "0")
    assert main(["env", "--explain"]) == 1
    captured = capsys.readouterr()
    assert "error" in captured.out and "RANK='x'" in captured.out
    assert captured.err.startswith("Error:")


def test_explain_json(clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["env", "--explain", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [v["name"] for v in data] == [d.name for d, _ in PRIORITY]
    assert [v["name"] for v in data if v["chosen"]] == ["local"]


def _eval_export(env: dict[str, str], names: list[str]) -> tuple[dict[str, str], str]:
    export_text = subprocess.run(
        [PYTHON, "-m", "torchhpc", "env", "--export"], env=env, capture_output=True, text=True, check=True
    ).stdout
    script = 'eval "$EXPORTS"\n' + "".join(f'printf "%s\\0" "${{{n}-<unset>}}"\n' for n in names)
    out = subprocess.run(
        ["bash", "-c", script], env={**env, "EXPORTS": export_text}, capture_output=True, text=True, check=True
    ).stdout
    return dict(zip(names, out.split("\0"))), export_text


@pytest.mark.parametrize(
    "host", [h for h in HOSTILE if h and "\n" not in h and not h.startswith("#")], ids=lambda v: repr(v)[:20]
)
def test_export_lines_survive_bash(host: str, tmp_path: Path) -> None:
    """A hostile first host (from a PBS nodefile) reaches MASTER_ADDR unchanged and runs nothing."""
    nodefile = tmp_path / "nodefile"
    nodefile.write_text(f"{host}\n{host}\nother\n")
    env = scrubbed(
        {
            "PBS_JOBID": "1234.pbs01",
            "PBS_NODEFILE": str(nodefile),
            "OMPI_COMM_WORLD_RANK": "2",
            "OMPI_COMM_WORLD_SIZE": "4",
            "OMPI_COMM_WORLD_LOCAL_RANK": "0",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
            "PYTHONPATH": str(REPO / "src"),
        }
    )
    names = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT"]
    values, _ = _eval_export({**env, "HOME": str(tmp_path)}, names)
    assert values == {
        "RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "GROUP_RANK": "1",
        "MASTER_ADDR": host, "MASTER_PORT": "11234",
    }
    assert not list(Path.cwd().glob("pwned*")) and not list(tmp_path.glob("pwned*"))


def test_export_keeps_user_values_even_hostile(tmp_path: Path) -> None:
    """A user-set value is neither exported nor echoed: a newline in it cannot escape a comment."""
    hostile = "x\ntouch pwned3"
    env = scrubbed({**STEP, "MASTER_ADDR": hostile, "PYTHONPATH": str(REPO / "src")})
    values, text = _eval_export(env, ["MASTER_ADDR", "RANK"])
    assert values == {"MASTER_ADDR": hostile, "RANK": "3"}
    assert "# keeping MASTER_ADDR (already set)" in text
    assert "pwned3" not in text


def test_exec_exports_then_becomes_the_command(tmp_path: Path) -> None:
    env = scrubbed({**STEP, "MASTER_PORT": "23456", "PYTHONPATH": str(REPO / "src")})
    code = ("import os, json; print(json.dumps({k: os.environ.get(k) for k in "
            "['RANK','LOCAL_RANK','WORLD_SIZE','MASTER_ADDR','MASTER_PORT','LOCAL_WORLD_SIZE']}), os.getpid())")
    probe = (
        "import os, subprocess, sys;"
        f"p = subprocess.run([sys.executable, '-m', 'torchhpc', 'exec', '-v', '--', sys.executable, '-c', {code!r}],"
        " capture_output=True, text=True); print(p.stdout, end=''); print(p.stderr, end='', file=sys.stderr)"
    )
    done = subprocess.run([PYTHON, "-c", probe], env=env, capture_output=True, text=True, check=True)
    data = json.loads(done.stdout.split("} ")[0] + "}")
    assert data == {
        "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "gpu01",
        "MASTER_PORT": "23456", "LOCAL_WORLD_SIZE": "2",
    }
    assert "slurm rank 3/4" in done.stderr
    assert "keeping" not in done.stderr  # the user's MASTER_PORT is what detection used: no clash


def test_exec_same_pid(tmp_path: Path) -> None:
    """exec replaces the process: the command's PID is the one srun/mpirun started."""
    env = scrubbed({"PYTHONPATH": str(REPO / "src")})
    proc = subprocess.Popen(
        [PYTHON, "-m", "torchhpc", "exec", "--", "bash", "-c", "echo $$"], env=env, stdout=subprocess.PIPE, text=True
    )
    out, _ = proc.communicate(timeout=60)
    assert int(out.strip()) == proc.pid


def test_exec_keeps_and_reports_a_differing_user_value() -> None:
    env = scrubbed({**STEP, "RANK": "7", "PYTHONPATH": str(REPO / "src")})
    done = subprocess.run(
        [PYTHON, "-m", "torchhpc", "exec", "--", "bash", "-c", 'echo "$RANK $LOCAL_RANK $MASTER_ADDR"'],
        env=env, capture_output=True, text=True, check=True,
    )
    assert done.stdout.strip() == "7 1 gpu01"
    assert "keeping RANK=7 set by the user (detected 3)" in done.stderr


def test_exec_errors(clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["exec"]) == 2
    assert "needs a command" in capsys.readouterr().err
    clean_env.setenv("SLURM_PROCID", "1")
    clean_env.setenv("SLURM_NTASKS", "2")
    before = dict(os.environ)
    assert main(["exec", "--", "no-such-program-xyz"]) == 127
    assert "no-such-program-xyz" in capsys.readouterr().err
    assert dict(os.environ) == before, "a failed exec left its exports in this process (MASTER_ADDR, RANK...)"


def test_cli_and_env_never_import_torch() -> None:
    code = (
        "import sys, torchhpc.env, torchhpc.cli.env, torchhpc.cli.exec, torchhpc.dist;"
        "from torchhpc.cli.main import build_parser; build_parser();"
        "import torchhpc.env as e; e.detect({}); e.explain({});"
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch.'))[:5]"
    )
    subprocess.run([PYTHON, "-c", code], check=True, env=scrubbed({"PYTHONPATH": str(REPO / "src")}))
