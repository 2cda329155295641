"""Golden files with readable diffs.

``assert_golden(text, "slurm/torchrun.sbatch")`` compares with tests/golden/...;
on mismatch it prints old -> new per line and the command that regenerates:
``TORCHHPC_REGEN_GOLDEN=1 pytest tests/...``. Scripts are also linted:
``bash -n`` always, shellcheck when installed (mandatory in CI: ``missing()``).
"""

from __future__ import annotations

import difflib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import in_ci, missing

GOLDEN = Path(__file__).parent / "golden"


def assert_golden(text: str, name: str) -> None:
    path = GOLDEN / name
    if os.environ.get("TORCHHPC_REGEN_GOLDEN") == "1" and not in_ci():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return
    if not path.exists():
        # never a pass: it compared nothing. Locally the first copy is written for review (and the test skips);
        # CI (any CI value in_ci() reads as on) writes nothing and fails.
        if not in_ci():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        missing(f"golden file {path} was missing: check the copy rendered now and commit it")
    old = path.read_text()
    if old != text:
        diff = "\n".join(
            difflib.unified_diff(old.splitlines(), text.splitlines(), f"golden/{name}", "rendered", lineterm="")
        )
        module = os.environ.get("PYTEST_CURRENT_TEST", "").split("::")[0]
        pytest.fail(f"{name} differs from its golden copy:\n{diff}\n\nIf intended: TORCHHPC_REGEN_GOLDEN=1 pytest {module}")


def lint_script(text: str, tmp_path: Path, shell: str = "bash") -> None:
    script = tmp_path / "script.sh"
    script.write_text(text)
    r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    if shutil.which("shellcheck") is None:
        missing("shellcheck is not installed (.ci/run installs it)")
    r = subprocess.run(["shellcheck", "-s", shell, "-S", "warning", str(script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
