"""``import torchhpc`` and the CLI's parse/render paths must not load torch.

torch costs ~2 s to import here and may be absent on login nodes; the CLI is
on every job's start-up path. Each check runs in a fresh interpreter (this
test process may have torch loaded already) and reports which torch modules
ended up in ``sys.modules``.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO, need

PROBE = r"""
import contextlib, io, json, sys
{body}
loaded = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
print("\nPROBE" + json.dumps(loaded))
"""

CLI = r"""
from torchhpc.cli.main import main
sink = io.StringIO()
with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
    try:
        rc = main({argv!r})
    except SystemExit as e:
        rc = e.code
print("RC", rc)
"""


def torch_modules_after(body: str) -> tuple[list[str], str]:
    cp = subprocess.run(
        [sys.executable, "-c", PROBE.format(body=body)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cp.returncode == 0, cp.stderr
    out, _, last = cp.stdout.rpartition("\nPROBE")
    loaded: list[str] = json.loads(last)
    return loaded, out


def test_import_torchhpc_loads_no_torch() -> None:
    loaded, _ = torch_modules_after("import torchhpc; import torchhpc.schedulers.local.local")
    assert loaded == []


def test_probe_can_see_torch() -> None:
    """The probe itself works: importing torch is reported."""
    need("torch")
    loaded, _ = torch_modules_after("import torch")
    assert "torch" in loaded


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["run", "--help"],
        ["run", "--dry-run", "-n", "4", "examples/pi.py"],
        ["run", "--dry-run", "-n", "2", "--", "python", "-c", "pass"],
        ["run", "--dry-run", "--scheduler", "slurm", "--nodes", "2", "--nproc-per-node", "2", "examples/pi.py"],
        ["env"],
    ],
    ids=lambda a: " ".join(a),
)
def test_cli_parse_and_render_load_no_torch(argv: list[str]) -> None:
    loaded, out = torch_modules_after(CLI.format(argv=argv))
    assert "RC " in out
    assert loaded == [], f"`torchhpc {' '.join(argv)}` imported {loaded[:5]}"


def test_local_run_parent_loads_no_torch() -> None:
    """The parent of a local job only manages processes; the workers import what they like."""
    argv = ["run", "-n", "2", "--", sys.executable, "-c", "import os; print(os.environ['RANK'])"]
    loaded, out = torch_modules_after(CLI.format(argv=argv))
    assert "RC 0" in out
    assert loaded == []
