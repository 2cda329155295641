"""The compatibility matrix, for real: other frameworks' own cluster detection under every launcher.

Rows are unmodified user scripts (tests/integration/compat/), columns torchrun, srun and mpirun on
2 nodes x 2 processes of the dev cluster's real Slurm, on the host and inside Charliecloud (the
image from .ci/build-test-image.sh). Nothing is faked: sbatch, srun, torchrun, Open MPI's mpirun,
ch-run, gloo, Lightning, submitit, idr_torch and mpi4py all run.

Cheap in CI: every cell's job script is what `torchhpc run --dry-run` prints (in-process), and each
runnable cell is its own test and its own job (its row's script under a time limit, its steps cancelled
if it hangs), one slot each, side by side with the rest of the suite (issue 66: one fixture running the
six columns at once held the machine for 14 minutes). Refused cells are checked the same way, before
anything is submitted. Each cell's outcome must be what docs/compat.md shows for it
(TORCHHPC_REGEN_GOLDEN=1 rewrites that cell).
A framework that is not installed makes its row FAIL, never skip.
"""

from __future__ import annotations

import contextlib
import difflib
import fcntl
import importlib.util
import io
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, container_image_env, missing
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
    doc_cell,
    expected,
    read_outcomes,
    render_markdown,
)
from torchhpc.cli.main import main as torchhpc_main

DOC = REPO / "docs" / "compat.md"
ROW_TIMEOUT = 300  # seconds per cell's job (Lightning under a loaded 2-core machine)
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


def cell_script(row: Row, col: Column, script: str, out_dir: Path) -> str:
    """The cell's job: its row's #SBATCH geometry, then its script under ROW_TIMEOUT (its steps cancelled if it
    hangs), the exit code appended to the log (a rank that aborts at exit after its work fails the cell)."""
    header = [line for line in script.splitlines() if line.startswith("#SBATCH")
              and not line.startswith(("#SBATCH --output", "#SBATCH --job-name"))]
    path, log = out_dir / f"{row.name}.sbatch", out_dir / f"{row.name}.log"
    path.write_text(script)
    lines = ["#!/bin/bash", *header, f"#SBATCH --job-name=compat-{row.name}-{col.key}",
             f"#SBATCH --output={out_dir}/cell.out", "set -u",
             'export USER="${USER:-root}"  # ch-run refuses to start without it', f"cd {REPO}",
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
             f"wait $pid; rc=$?; echo \"compat: exit $rc\" >> {log}"]
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
    images = container_image_env()  # the container columns: the ch-run image built by .ci/build-test-image.sh
    assert "TORCHHPC_TEST_CH_IMAGE" in images, images
    return images["TORCHHPC_TEST_CH_IMAGE"]


def run_cell(slurm: Any, image: str, row: Row, col: Column, out_dir: Path) -> Outcome:
    """One cell: render it (`torchhpc run --dry-run`, in-process), then, for a runnable one, its own job on the
    dev cluster (the row's script under a time limit, its steps cancelled if it hangs), judged from its log."""
    want = expected(row, col)
    if want == "n/a":
        return Outcome("n/a", NOT_IN_IMAGE)
    rc, out, err = cli(*run_args(row, col, image, out_dir))
    if want == "refused":
        hint = REFUSED[(row.name, col.launcher)]
        ok = rc == 2 and err.startswith("Error: ") and "HINT: " in err and hint in err and not out
        ok = ok and "Traceback" not in err
        return Outcome("refused", hint) if ok else Outcome(
            "FAIL", f"expected a refusal naming {hint}: rc {rc}, {err.strip()[:300]}")
    if rc != 0:
        return Outcome("FAIL", f"dry run failed: rc {rc}: {err.strip()[:300]}")
    write_files(out)
    script = out_dir / "cell.sbatch"
    script.write_text(cell_script(row, col, batch_script(out), out_dir))
    job_id = slurm.sbatch([str(script)], cwd=str(REPO))
    states = wait_all(slurm, [job_id], timeout=ROW_TIMEOUT + 120)
    log = out_dir / f"{row.name}.log"
    outcome = judge(log.read_text(errors="replace") if log.exists() else "", row)
    if outcome.status != "ok":
        outcome = Outcome("FAIL", f"{outcome.detail} (job {job_id} {states.get(job_id, '?')}, log {log})")
    return outcome


def write_doc_cell(row: Row, col: Column, outcome: Outcome) -> None:
    """TORCHHPC_REGEN_GOLDEN=1: this cell's outcome into docs/compat.md, under a lock (the cells run side by side)."""
    with open(f"{tempfile.gettempdir()}/torchhpc-compat-doc.lock", "ab") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        outcomes = read_outcomes(DOC.read_text()) if DOC.exists() else {}
        outcomes[(row.name, col.key)] = outcome
        DOC.write_text(render_markdown(outcomes))


def test_frameworks_are_installed() -> None:
    """A framework that is missing fails its row here (CI installs the compat and lightning extras)."""
    absent = sorted({m for row in ROWS for m in row.needs if importlib.util.find_spec(m) is None})
    assert not absent, f"not installed: {absent}: pip install -e '.[lightning,compat]' (scripts/setup.sh does)"


@pytest.mark.cluster("slurm")
@pytest.mark.parametrize("col", COLUMNS, ids=lambda c: c.key)
@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_cell(slurm: Any, image: str, row: Row, col: Column, tmp_path: Path) -> None:
    """One cell of the matrix: its outcome is what the matrix expects, and what docs/compat.md shows for it.
    Each runnable cell is its own job and its own test (one slot each): the six columns' jobs run side by
    side with the rest of the suite, not as one fixture holding the machine for minutes."""
    got = run_cell(slurm, image, row, col, tmp_path)
    want = expected(row, col)
    assert got.status == want, f"{row.name} x {col.key}: expected {want}, got {got.status}: {got.detail}"
    if os.environ.get("TORCHHPC_REGEN_GOLDEN") == "1":
        write_doc_cell(row, col, got)
    shown = read_outcomes(DOC.read_text()).get((row.name, col.key))
    assert shown == got, (f"docs/compat.md shows {doc_cell(shown) if shown else 'nothing'} for {row.name} x "
                          f"{col.key}, this run {doc_cell(got)}: TORCHHPC_REGEN_GOLDEN=1 pytest {__file__}")


def test_docs_compat_md_is_the_generated_table() -> None:
    """Around the cells (each checked by its own run above), docs/compat.md is what render_markdown writes."""
    old = DOC.read_text()
    text = render_markdown(read_outcomes(old))
    if os.environ.get("TORCHHPC_REGEN_GOLDEN") == "1":
        DOC.write_text(text)
        old = text
    if old != text:
        diff = "".join(difflib.unified_diff(old.splitlines(True), text.splitlines(True), "docs/compat.md", "render"))
        pytest.fail(f"docs/compat.md differs from render_markdown:\n{diff}\n"
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
