"""The compatibility matrix, for real: other frameworks' own cluster detection under every launcher.

Rows are unmodified user scripts (tests/integration/compat/), columns torchrun, srun and mpirun on
2 nodes x 2 processes of the dev cluster's real Slurm, on the host and inside Charliecloud (the
image from .ci/build-test-image.sh). Nothing is faked: sbatch, srun, torchrun, Open MPI's mpirun,
ch-run, gloo, Lightning, submitit, idr_torch and mpi4py all run.

Cheap in CI: every cell's job script is what `torchhpc run --dry-run` prints (in-process), and one
allocation per column runs its rows' scripts one after the other (each with a time limit, its
steps cancelled if it hangs); the six columns are submitted at once.
Refused cells are checked the same way, before anything is submitted. docs/compat.md is written
from the outcomes; the committed copy must match (TORCHHPC_REGEN_GOLDEN=1 rewrites it).
A framework that is not installed makes its row FAIL, never skip.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib.util
import io
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, missing
from tests.integration.compat.matrix import (
    COLUMNS,
    HERE,
    NOT_IN_IMAGE,
    REFUSED,
    ROWS,
    WORLD,
    Column,
    Outcome,
    Row,
    expected,
    render_markdown,
)
from tests.parallel import hold_whole_machine
from torchhpc.cli.main import main as torchhpc_main

DOC = REPO / "docs" / "compat.md"
ROW_TIMEOUT = 300  # seconds per row inside a column job (Lightning under a loaded 2-core machine)
EXIT = re.compile(r"^compat: exit (\d+)$", re.M)
# Two ranks of one torchrun share its stdout: a record can run into the next one on the same line
# ("via=TorchElasticEnvironmentCOMPAT row=..."), so the via value stops where the next record starts.
RECORD = re.compile(r"COMPAT row=(\w+) rank=(\d+) world=(\d+) sum=([0-9.]+) via=(\w+?(?:://)?)(?=COMPAT row=|\W|$)")


def cli(*args: str) -> tuple[int, str, str]:
    """`torchhpc ARGS` in this process (the same code path, no interpreter start per cell)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = torchhpc_main(list(args))
    return rc, out.getvalue(), err.getvalue()


def run_args(row: Row, col: Column, image: str | None, out_dir: Path) -> list[str]:
    args = ["run", "--scheduler", "slurm", "--nodes", "2", "--nproc-per-node", "2", "--launcher", col.launcher,
            "--output-dir", str(out_dir), "--name", f"compat-{row.name}"]
    if col.runtime:
        assert image is not None
        args += ["--runtime", col.runtime, "--container", image]
    return [*args, "--dry-run", str(HERE / row.script)]


def batch_script(dry_run: str) -> str:
    """The job script from `torchhpc run --dry-run` output (its `# --- PATH.sbatch ---` section)."""
    m = re.search(r"^# --- \S+\.sbatch(?: \([^)]*\))? ---\n(.*?)(?=^# --- )", dry_run, re.S | re.M)
    assert m, dry_run
    return m.group(1)


def write_files(dry_run: str) -> None:
    """Write the rank boot copy the dry run names beside the script (a container's ranks use it:
    ``# --- <output-dir>/.torchhpc-boot-<hash>/ --- torchhpc's boot copy, written at submit: ...``), as a
    submit would: without it the script stops before its launch (no task.sh)."""
    from torchhpc.launchers.boot import boot_files

    for m in re.finditer(r"^# --- (/\S+/\.torchhpc-boot-\w+)/ --- torchhpc's boot copy", dry_run, re.M):
        Path(m.group(1)).mkdir(parents=True, exist_ok=True)
        for name, text in boot_files():
            (Path(m.group(1)) / name).write_text(text)


def column_script(col: Column, rows: list[tuple[Row, str]], out_dir: Path) -> str:
    """One allocation for a column: the first row's #SBATCH geometry, then each row's script in turn."""
    header = [line for line in rows[0][1].splitlines() if line.startswith("#SBATCH")
              and not line.startswith(("#SBATCH --output", "#SBATCH --job-name"))]
    lines = ["#!/bin/bash", *header, f"#SBATCH --job-name=compat-{col.key}", f"#SBATCH --output={out_dir}/column.out",
             "set -u", 'export USER="${USER:-root}"  # ch-run refuses to start without it', f"cd {REPO}"]
    for row, script in rows:
        path = out_dir / f"{row.name}.sbatch"
        path.write_text(script)
        log = out_dir / f"{row.name}.log"
        lines += [
            f"echo '=== {row.name}' $(date +%T)",
            # MASTER_PORT is left to the row's script (derived from the job id, moved while busy), as in any
            # torchhpc job: idr_torch overwrites MASTER_PORT with that same formula, whatever is exported.
            f"bash {path} > {log} 2>&1 &",
            "pid=$!",
            f"for _ in $(seq {ROW_TIMEOUT}); do kill -0 $pid 2>/dev/null || break; sleep 1; done",
            "if kill -0 $pid 2>/dev/null; then",
            f"  echo 'compat: row timed out after {ROW_TIMEOUT} s' >> {log}",
            '  for s in $(squeue -h -s -j "$SLURM_JOB_ID" -o %i | grep -v -e batch -e extern); do scancel "$s"; done',
            "  sleep 2; kill $pid 2>/dev/null",
            "fi",
            f"wait $pid; rc=$?; echo \"=== rc $rc\"; echo \"compat: exit $rc\" >> {log}",
        ]
    return "\n".join(lines) + "\n"


def judge(log: str, row: Row, world: int = WORLD) -> Outcome:
    records = [m.groups() for m in RECORD.finditer(log) if m.group(1) == row.name]
    if not records:
        tail = " | ".join(line for line in log.splitlines()[-6:] if line.strip())[-400:]
        return Outcome("FAIL", f"no rank reported: {tail}")
    ranks = sorted(int(r[1]) for r in records)
    worlds = {int(r[2]) for r in records}
    sums = {float(r[3]) for r in records}
    vias = sorted({r[4] for r in records})
    if ranks != list(range(world)) or worlds != {world} or sums != {float(world * (world + 1) // 2)}:
        return Outcome("FAIL", f"ranks {ranks}, worlds {sorted(worlds)}, sums {sorted(sums)}")
    if "no exit cures" in log:  # the boot copy the script names is missing: the cell would not be torchhpc's
        return Outcome("FAIL", "the ranks ran without the exit cures: " + log[log.index("no exit cures"):][:200])
    # The job must also end well: a rank that aborts at exit after its work (issue 29) fails the cell.
    exits = EXIT.findall(log)
    if exits != ["0"]:
        return Outcome("FAIL", f"every rank reported, but the job exited {'/'.join(exits) or 'never'}")
    return Outcome("ok", "/".join(vias))


def wait_all(slurm: Any, job_ids: list[str], timeout: float) -> dict[str, str]:
    """Poll squeue until none of the jobs is queued or running (a finished job soon leaves scontrol too)."""
    deadline = time.monotonic() + timeout
    last: dict[str, str] = {}
    while True:
        out = slurm.run(["squeue", "-h", "-j", ",".join(job_ids), "-o", "%i %T"], timeout=30, check=False).stdout
        live = dict(line.split() for line in out.splitlines() if len(line.split()) == 2)
        for job_id in job_ids:
            last[job_id] = live.get(job_id, "ENDED")
        if not live:
            return last
        if time.monotonic() > deadline:
            slurm.run(["scancel", *job_ids], check=False)
            pytest.fail(f"compat jobs still {live} after {timeout:.0f} s")
        time.sleep(2)


@pytest.fixture(scope="module")
def image() -> str:
    build = REPO / ".ci" / "build-test-image.sh"
    if os.geteuid() != 0:
        missing("the container columns need root (ch-run image built by .ci/build-test-image.sh)")
    r = subprocess.run(["bash", str(build)], capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        missing(f"{build.name} failed: {r.stderr[-2000:]}")
    cache = os.environ.get("TORCHHPC_TEST_IMAGE_CACHE", "/var/tmp/torchhpc-test-image")
    env_text = Path(cache, "env").read_text()
    m = re.search(r"^export TORCHHPC_TEST_CH_IMAGE=(.*)$", env_text, re.M)
    assert m, env_text
    return m.group(1)


@pytest.fixture(scope="module")
def outcomes(slurm: Any, image: str, tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Outcome]:
    """Render every cell, run the runnable ones (one job per column, all submitted at once), judge them.
    Side by side it holds every slot but one meanwhile; the cells that read it are ``light``."""
    with hold_whole_machine():
        return _outcomes(slurm, image, tmp_path_factory)


def _outcomes(slurm: Any, image: str, tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Outcome]:
    base = tmp_path_factory.mktemp("compat")
    results: dict[tuple[str, str], Outcome] = {}
    jobs: list[tuple[Column, list[Row], Path, str]] = []
    for col in COLUMNS:
        out_dir = base / col.key
        out_dir.mkdir()
        runnable: list[tuple[Row, str]] = []
        for row in ROWS:
            want = expected(row, col)
            if want == "n/a":
                results[(row.name, col.key)] = Outcome("n/a", NOT_IN_IMAGE)
                continue
            rc, out, err = cli(*run_args(row, col, image, out_dir))
            if want == "refused":
                hint = REFUSED[(row.name, col.launcher)]
                ok = rc == 2 and err.startswith("Error: ") and "HINT: " in err and hint in err and not out
                ok = ok and "Traceback" not in err
                results[(row.name, col.key)] = Outcome("refused", hint) if ok else Outcome(
                    "FAIL", f"expected a refusal naming {hint}: rc {rc}, {err.strip()[:300]}")
                continue
            if rc != 0:
                results[(row.name, col.key)] = Outcome("FAIL", f"dry run failed: rc {rc}: {err.strip()[:300]}")
                continue
            write_files(out)
            runnable.append((row, batch_script(out)))
        if runnable:
            script = out_dir / "column.sbatch"
            script.write_text(column_script(col, runnable, out_dir))
            jobs.append((col, [r for r, _ in runnable], out_dir, slurm.sbatch([str(script)], cwd=str(REPO))))
    states = wait_all(slurm, [job_id for *_, job_id in jobs], timeout=25 * 60)
    for col, rows, out_dir, job_id in jobs:
        for row in rows:
            log = out_dir / f"{row.name}.log"
            text = log.read_text(errors="replace") if log.exists() else ""
            outcome = judge(text, row)
            if outcome.status != "ok":
                outcome = Outcome("FAIL", f"{outcome.detail} (job {job_id} {states.get(job_id, '?')}, log {log})")
            results[(row.name, col.key)] = outcome
    return results


def test_frameworks_are_installed() -> None:
    """A framework that is missing fails its row here (CI installs the compat and lightning extras)."""
    absent = sorted({m for row in ROWS for m in row.needs if importlib.util.find_spec(m) is None})
    assert not absent, f"not installed: {absent}: pip install -e '.[lightning,compat]' (scripts/setup.sh does)"


@pytest.mark.light  # a judgement of the outcomes fixture's (which holds the machine while the columns run)
@pytest.mark.cluster("slurm")
@pytest.mark.parametrize("col", COLUMNS, ids=lambda c: c.key)
@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_cell(outcomes: dict[tuple[str, str], Outcome], row: Row, col: Column) -> None:
    got = outcomes[(row.name, col.key)]
    want = expected(row, col)
    assert got.status == want, f"{row.name} x {col.key}: expected {want}, got {got.status}: {got.detail}"


@pytest.mark.light  # writes the outcomes fixture's table
@pytest.mark.cluster("slurm")
def test_docs_compat_md_is_the_generated_table(outcomes: dict[tuple[str, str], Outcome]) -> None:
    text = render_markdown(outcomes)
    if os.environ.get("TORCHHPC_REGEN_GOLDEN") == "1" and all(o.status != "FAIL" for o in outcomes.values()):
        DOC.write_text(text)
    old = DOC.read_text() if DOC.exists() else ""
    if old != text:
        diff = "".join(difflib.unified_diff(old.splitlines(True), text.splitlines(True), "docs/compat.md", "this run"))
        pytest.fail(f"docs/compat.md differs from this run's matrix:\n{diff}\n"
                    "If intended: TORCHHPC_REGEN_GOLDEN=1 pytest tests/integration/test_compat_matrix.py")


def test_hf_trainer_local_two_ranks(tmp_path: Path) -> None:
    """The Hugging Face Trainer row under `torchhpc run -n 2` (local scheduler): both ranks report
    world 2, their all_reduce sums to 3, and the job exits 0 (no rank aborts at exit: issue 29)."""
    row = next(r for r in ROWS if r.name == "hf_trainer")
    absent = [m for m in row.needs if importlib.util.find_spec(m) is None]
    if absent:
        missing(f"not installed: {absent}: pip install -e '.[compat]'")
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    r = subprocess.run([sys.executable, "-m", "torchhpc", "run", "-n", "2", "--output-dir", str(tmp_path),
                        str(HERE / row.script)], capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    outcome = judge(f"{r.stdout}\n{r.stderr}\ncompat: exit {r.returncode}\n", row, world=2)
    assert outcome.status == "ok", f"{outcome.detail}\n{r.stderr[-3000:]}"
