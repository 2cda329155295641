"""docs/profiles.md's "ours" column says what the golden render of each profile really holds.

Every code fragment in a profile's table (the ``ours`` column, in backticks) must appear in
that profile's golden file (tests/golden/profiles/NAME.txt, checked against the renderer by
test_profile_goldens.py); ``...`` separates pieces that may have text between them and
``OUTDIR`` stands for the job's output directory. RunAI's command is quoted twice in the golden
(``bash -c '"...\\"\\$X\\"..."'``); the page shows what the pod runs, so backslash escapes are
undone before the search. A renderer change that updates the golden
file but not the page fails here.
"""

from __future__ import annotations

import re

import pytest

from tests.conftest import REPO
from tests.script_text import unwrap

DOC = REPO / "docs" / "profiles.md"
GOLDEN = REPO / "tests" / "golden" / "profiles"


def sections() -> dict[str, list[str]]:
    """Profile name -> the ``ours`` cells of its table."""
    out: dict[str, list[str]] = {}
    name = ""
    for line in DOC.read_text().splitlines():
        m = re.match(r"^## (\S+) — ", line)
        if m:
            name = m.group(1)
            out[name] = []
        elif line.startswith("## "):  # a section that is not one profile's table
            name = ""
        elif name and line.startswith("| ") and not line.startswith(("| seed |", "|---")):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
            if len(cells) >= 2:
                out[name].append(cells[1].replace("\\|", "|"))
    return out


def fragment_pattern(code: str) -> re.Pattern[str]:
    pieces = [re.escape(p.strip()) for p in code.split("...") if p.strip()]
    return re.compile(".*?".join(p.replace("OUTDIR", r"\S+") for p in pieces), re.S)


@pytest.mark.parametrize("name", sorted(sections()))
def test_ours_column_matches_the_golden(name: str) -> None:
    golden = unwrap((GOLDEN / f"{name}.txt").read_text())  # the launch command is wrapped at its arguments
    golden += "\n" + re.sub(r"\\(.)", r"\1", golden)  # what the pod runs, under RunAI's second quoting layer
    wrong = []
    for cell in sections()[name]:
        for code in re.findall(r"`([^`]+)`", cell):
            if not fragment_pattern(code).search(golden):
                wrong.append(code)
    assert wrong == [], f"docs/profiles.md, {name}: not in tests/golden/profiles/{name}.txt: {wrong}"
