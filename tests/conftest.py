"""Shared test fixtures.

``HOSTILE`` values are the inputs every renderer must carry through a real
shell unchanged (after submitit's ``weird_tmp_path``).

Tests that need a real scheduler are marked ``@pytest.mark.cluster("slurm")``
and use the ``slurm_cluster`` fixture (tests/integration/conftest.py). Without a
cluster they skip locally, but when ``CI=true`` a missing cluster is a failure:
CI must never pass by skipping the real thing.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

import pytest

HOSTILE: list[str] = [
    "a 0",
    'a"=0"',
    "a'; echo foo",
    "a\\=",
    "line1\nline2",
    "$HOME",
    "$(touch pwned)",
    "`touch pwned2`",
    "a;b&&c|d",
    "#not a comment",
    "",
    "*",
    "~root",
]

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture(params=HOSTILE, ids=lambda v: repr(v)[:20])
def hostile(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def missing(reason: str) -> NoReturn:
    """Skip locally; fail in CI (where the real thing is mandatory). Also at a module's top level."""
    if in_ci():
        pytest.fail(f"{reason} (CI=true makes this mandatory)", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def need(module: str, why: str = "") -> Any:
    """``pytest.importorskip`` under the :func:`missing` rule: the module, else a skip here and a failure in
    CI (whose venv has the dev, lightning and compat extras: scripts/test.sh). At a module's top level
    the whole module fails in CI rather than skipping unseen."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        missing(f"{module} cannot be imported ({e})" + (f": {why}" if why else ""))


@pytest.fixture
def clean_user_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No TORCHHPC_*/SBATCH_* variables, no user config (HOME is the test's tmp dir), job state in
    the tmp dir too, and the repository as the working directory (examples/pi.py resolves)."""
    for k in list(os.environ):
        if k.startswith(("TORCHHPC_", "SBATCH_")):
            monkeypatch.delenv(k)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.setenv("TORCHHPC_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.chdir(REPO)
