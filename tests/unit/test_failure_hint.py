"""A failed local rank's HINT points at what it left on the screen (issue 26, item 5): a torchhpc tool
ends with ``Error:``/``HINT:`` lines and no traceback, so "look for its traceback" would send the
user looking for something that is not there. Real ranks, started by the local scheduler."""

from __future__ import annotations

import sys

import pytest

from torchhpc.cli.main import main

ERROR = "import sys; print('Error: --plot needs matplotlib'); print('HINT: pip install matplotlib'); sys.exit(2)"
RAISE = "raise ValueError('bad value')"
QUIET = "import sys; sys.exit(3)"


@pytest.mark.usefixtures("clean_user_env")
@pytest.mark.parametrize(("program", "hint"), [
    (ERROR, "HINT: its error and HINT are above, prefixed [rank0]:"),
    (RAISE, "diagnosis: user-exception"),  # the verdict names it: no hint pointing at the traceback
    (QUIET, "HINT: it printed nothing"),
])
def test_hint_names_what_the_rank_printed(program: str, hint: str, capfd: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "-n", "1", "--", sys.executable, "-c", program]) != 0
    err = capfd.readouterr().err
    assert hint in err, err


@pytest.mark.usefixtures("clean_user_env")
def test_the_same_error_from_every_rank_is_shown_once(capfd: pytest.CaptureFixture[str]) -> None:
    """Two NCCL ranks on one GPU: thd.init() refuses on every rank with the same Error/HINT pair
    (recorded on an H200); the screen shows it once, and the HINT names the rank that showed it."""
    same = ("import sys; print('Error: 2 ranks on this node but 1 GPU visible', file=sys.stderr); "
            "print('HINT: start at most 1 rank per node', file=sys.stderr); sys.exit(1)")
    assert main(["run", "-n", "2", "--", sys.executable, "-c", same]) != 0
    err = capfd.readouterr().err
    shown = [ln for ln in err.splitlines() if ln.endswith("Error: 2 ranks on this node but 1 GPU visible")]
    assert len(shown) == 1, err
    assert err.count("HINT: start at most 1 rank per node") == 1, err
    rank = shown[0].split("]")[0] + "]:"
    assert f"HINT: its error and HINT are above, prefixed {rank}" in err, err
