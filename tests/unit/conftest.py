"""The unit tests' own job-record store: never the machine's (``~/.cache/torchhpc``). A unit test that reads a job
back through a fake scheduler found the dev cluster's real job 5 there (the suite's soak had left its record and
end marker), and the marker won over the fake's answer."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _own_record_store(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    if "TORCHHPC_STATE_DIR" not in os.environ:  # a test (or clean_user_env) may set its own
        monkeypatch.setenv("TORCHHPC_STATE_DIR", str(Path(tmp_path_factory.getbasetemp()) / "unit-state"))
