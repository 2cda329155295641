"""Variables that disagree with the detected rank, and the script scan before launch.

Environments are written by hand from what srun, Open MPI's orted step and torchrun
export (the matrix on the dev cluster proves the end-to-end behaviour).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from torchhpc.core.spec import Entrypoint, JobSpec
from torchhpc.env import detect
from torchhpc.env.compat import disagreements, preflight, scan_script
from torchhpc.errors import SpecError

REPO = Path(__file__).resolve().parents[2]
COMPAT = REPO / "tests" / "integration" / "compat"

# An mpirun rank (3 of 4) started without the shim, beside the srun step of Open MPI's daemons.
MPIRUN_NO_SHIM = {
    "SLURM_JOB_ID": "42",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "1",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "1",
    "SLURM_NTASKS": "2",
    "SLURM_NTASKS_PER_NODE": "1",
    "OMPI_COMM_WORLD_RANK": "3",
    "OMPI_COMM_WORLD_SIZE": "4",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    "MASTER_ADDR": "10.0.0.1",
    "MASTER_PORT": "12345",
}


def test_slurm_procid_that_names_another_rank_is_reported_with_readers_and_hint() -> None:
    found = {d.name: d for d in disagreements(detect(MPIRUN_NO_SHIM), MPIRUN_NO_SHIM)}
    assert set(found) == {"SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_NTASKS_PER_NODE"}
    d = found["SLURM_PROCID"]
    assert d.message.startswith("SLURM_PROCID=1 but this process is rank 3: Lightning's SLURMEnvironment, submitit")
    assert "would see the wrong world" in d.message
    assert "--launcher" in d.hint and "mpirun" in d.hint
    assert found["SLURM_NTASKS"].message.startswith("SLURM_NTASKS=2 but the world has 4 processes")


def test_after_the_shim_nothing_disagrees() -> None:
    env = dict(MPIRUN_NO_SHIM)
    argv = ["bash", "-c", "env -0"]
    from torchhpc.launchers.boot import task_argv

    out = subprocess.run(task_argv(argv, launcher="mpirun"), env={"PATH": "/usr/bin:/bin", **env},
                         capture_output=True, timeout=30, check=True).stdout.decode()
    shimmed = dict(item.split("=", 1) for item in out.split("\0") if "=" in item)
    assert disagreements(detect(shimmed), shimmed) == []


def test_stale_mpi_variables_under_srun_are_reported() -> None:
    env = {"SLURM_JOB_ID": "5", "SLURM_STEP_ID": "0", "SLURM_PROCID": "2", "SLURM_LOCALID": "0", "SLURM_NODEID": "1",
           "SLURM_NTASKS": "4", "SLURM_STEP_NUM_TASKS": "4", "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_NNODES": "2",
           "SLURM_STEP_NODELIST": "n[1-2]", "PMI_RANK": "0", "PMI_SIZE": "1"}
    # PMI wins detection (MPI before Slurm): PMI says 0 of 1, so nothing is "multi-process" -> nothing reported;
    # torchhpc's shim drops the stale PMI_* and then Slurm's view is the detected one.
    assert disagreements(detect(env), env) == []
    env.pop("PMI_RANK")
    env.pop("PMI_SIZE")
    env["MV2_COMM_WORLD_RANK"] = "7"
    names = [d.name for d in disagreements(detect(env), env)]
    assert names == ["MV2_COMM_WORLD_RANK"]


def test_a_single_process_is_never_flagged() -> None:
    env = {"SLURM_JOB_ID": "5", "SLURM_PROCID": "0", "SLURM_NTASKS": "8"}  # a batch script: the job's numbers
    assert disagreements(detect(env), env) == []


def test_scan_hard_soft_guarded() -> None:
    reads = {(r.what, r.hard, r.guarded) for r in scan_script((COMPAT / "ompi_vars.py").read_text())}
    assert ("OMPI_COMM_WORLD_RANK", True, False) in reads
    pi = scan_script((REPO / "examples" / "pi.py").read_text())  # tests "X" in env for every launcher
    assert pi and all(r.guarded for r in pi)
    soft = scan_script('rank = int(os.environ.get("SLURM_PROCID", 0))  # SLURM_NTASKS in a comment\n')
    assert [(r.what, r.hard) for r in soft] == [("SLURM_PROCID", False)]
    imports = scan_script("from mpi4py import MPI\ntry:\n    import idr_torch\nexcept ImportError:\n    pass\n")
    assert [(r.family, r.hard) for r in imports] == [("mpi4py", True), ("idr_torch", False)]


def spec_for(script: Path | str, scheduler: str, launcher: str) -> JobSpec:
    return JobSpec(entrypoint=Entrypoint.parse([str(script)]), scheduler=scheduler, launcher=launcher, nodes=2,
                   nproc_per_node=2)


@pytest.mark.parametrize(
    ("row", "scheduler", "launcher", "right"),
    [
        ("ompi_vars", "slurm", "srun", "--launcher mpirun"),
        ("ompi_vars", "slurm", "torchrun", "--launcher mpirun"),
        ("mpi4py_world", "slurm", "torchrun", "--launcher mpirun"),
        ("idr_torch_env", "slurm", "mpirun", "--launcher srun or torchrun"),
        ("slurm_vars", "pbs", "mpirun", "--scheduler slurm"),
    ],
)
def test_preflight_refuses_with_the_right_launcher(row: str, scheduler: str, launcher: str, right: str) -> None:
    with pytest.raises(SpecError) as e:
        preflight(spec_for(COMPAT / f"{row}.py", scheduler, launcher))
    assert right in (e.value.hint or "")


def test_idr_torch_is_fine_under_any_torchrun() -> None:
    assert preflight(spec_for(COMPAT / "idr_torch_env.py", "local", "torchrun")) == []
    assert preflight(spec_for(COMPAT / "idr_torch_env.py", "pbs", "torchrun")) == []


@pytest.mark.parametrize("row", ["ompi_vars", "mpi4py_world", "slurm_vars", "submitit_env", "lightning_fabric"])
def test_preflight_passes_what_mpirun_on_slurm_provides(row: str) -> None:
    assert preflight(spec_for(COMPAT / f"{row}.py", "slurm", "mpirun")) == []


def test_preflight_soft_read_warns_and_the_switch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    soft = tmp_path / "soft.py"
    soft.write_text('import os\nrank = int(os.environ.get("OMPI_COMM_WORLD_RANK", 0))\n')
    (warning,) = preflight(spec_for(soft, "slurm", "srun"))
    assert "OMPI_COMM_WORLD_RANK" in warning and "HINT: use --launcher mpirun" in warning
    monkeypatch.setenv("TORCHHPC_COMPAT", "warn")
    assert len(preflight(spec_for(COMPAT / "ompi_vars.py", "slurm", "srun"))) == 1
    monkeypatch.setenv("TORCHHPC_COMPAT", "off")
    assert preflight(spec_for(COMPAT / "ompi_vars.py", "slurm", "srun")) == []


def test_cli_refuses_before_rendering_with_error_and_hint() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "torchhpc", "run", "--scheduler", "slurm", "--nodes", "2", "--nproc-per-node", "2",
         "--launcher", "srun", "--dry-run", "tests/integration/compat/ompi_vars.py"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.startswith("Error: tests/integration/compat/ompi_vars.py:")
    assert "HINT: use --launcher mpirun" in r.stderr and "Traceback" not in r.stderr
    assert r.stdout == ""


def test_doctor_in_job_reports_the_disagreement() -> None:
    from torchhpc.doctor import Context, check_environment

    check = check_environment(Context(environ=MPIRUN_NO_SHIM, in_job=True))
    assert check.status == "fail" and check.detail.startswith("SLURM_PROCID=1 but this process is rank 3")
    assert "SLURM_NTASKS" in check.detail and check.hint and "shim" in check.hint
    clean = {k: v for k, v in MPIRUN_NO_SHIM.items() if not k.startswith("SLURM_")}
    assert check_environment(Context(environ=clean, in_job=True)).status == "pass"
    assert check_environment(Context(environ=MPIRUN_NO_SHIM, in_job=False)).status == "skip"


def test_env_explain_lists_the_disagreements() -> None:
    env = {"PATH": "/usr/bin:/bin", **MPIRUN_NO_SHIM}
    r = subprocess.run([sys.executable, "-m", "torchhpc", "env", "--explain"], env=env, cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "variables that disagree with rank 3 of 4 (openmpi):" in r.stdout
    assert "SLURM_PROCID=1 but this process is rank 3: Lightning's SLURMEnvironment" in r.stdout
    assert "HINT: start each rank through torchhpc's per-task shim" in r.stdout


def test_committed_compat_table_matches_the_expected_matrix() -> None:
    """docs/compat.md is written by the cluster test; here (no cluster) its cells must say what the matrix expects."""
    from tests.integration.compat.matrix import COLUMNS, ROWS, expected

    text = (REPO / "docs" / "compat.md").read_text()
    table = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| script |")]
    by_title = {line.split(" | ")[0][2:]: [c.strip() for c in line.strip("| \n").split(" | ")[1:]] for line in table}
    mark = {"ok": "✔", "refused": "refused", "n/a": "—"}
    for row in ROWS:
        cells = by_title[row.title]
        assert len(cells) == len(COLUMNS), row.title
        for col, cell in zip(COLUMNS, cells):
            assert cell.startswith(mark[expected(row, col)]), (row.name, col.key, cell)
    assert "[docs/compat.md](docs/compat.md)" in (REPO / "README.md").read_text()
