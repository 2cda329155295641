"""The class-coded exit status (core/exitcodes.py): one code per verdict class, outside every
convention a site's requeue logic could confuse it with, and the table docs/resilience.md shows."""

from __future__ import annotations

import re
from pathlib import Path

from torchhpc.core.exitcodes import EXIT_CODES, INFRASTRUCTURE, class_of_exit, exit_code_for
from torchhpc.diagnose.classify import CLASSES
from torchhpc.supervisor.policy import POLICY, RESTART_CLASSES

DOC = Path(__file__).resolve().parents[2] / "docs" / "resilience.md"


def test_every_class_has_its_own_code_in_the_free_block() -> None:
    assert set(CLASSES) | {"no-progress", "collective-mismatch"} <= set(EXIT_CODES)
    assert set(EXIT_CODES) <= set(POLICY)  # every coded class has an action
    codes = list(EXIT_CODES.values())
    assert len(set(codes)) == len(codes)
    for code in codes:  # not success/error/usage, sysexits, the shell's, a signal's, systemd's, ssh's
        assert 80 <= code <= 95, code
        assert code not in range(64, 79) and code not in range(126, 193)
    assert INFRASTRUCTURE == RESTART_CLASSES  # a site's requeue rule: 80-83


def test_a_code_reads_back_as_its_class() -> None:
    assert exit_code_for(None) == 0
    assert exit_code_for("hang") == 81 and class_of_exit(81) == "hang"
    assert exit_code_for("a class nobody knows") == EXIT_CODES["unknown"]
    assert class_of_exit(1) is None and class_of_exit(143) is None and class_of_exit(None) is None


def test_the_documented_table_is_the_code() -> None:
    rows = dict(re.findall(r"^\| `([a-z-]+)` \| (\d+) \|", DOC.read_text(), re.M))
    assert {k: int(v) for k, v in rows.items()} == EXIT_CODES
