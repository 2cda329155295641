"""One idea, one home (issue 69): the "off" words and the duration grammar live in core/units.py, the exit
table in core/exitcodes.py. A copy elsewhere drifts (the off words were 7 copies as 3 different sets; the
exit table was re-exported by two modules and imported through them). The stdlib-only rank boot keeps its
own copy of the off words: held equal here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO
from torchhpc.core.units import OFF_WORDS, ON_WORDS, is_off, parse_switch, parse_timeout
from torchhpc.errors import SpecError

SRC = REPO / "src" / "torchhpc"
HOME = {"core/units.py"}
BOOT = "boot/sitecustomize.py"  # stdlib only: a copy, held equal below
# Not switches: the YAML words a Kubernetes render must quote.
NOT_SWITCHES = {"schedulers/kubernetes/yaml_text.py"}


def word_sets(path: Path) -> list[tuple[int, set[str]]]:
    """Literal tuples, sets and lists of strings that hold "off" beside another off word."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Tuple, ast.Set, ast.List)):
            words = {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
            if "off" in words and words & {"0", "false", "no", "none"}:
                found.append((node.lineno, words))
    return found


def off_word_copies(root: Path) -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel in HOME | NOT_SWITCHES | {BOOT}:
            continue
        out += [f"{rel}:{line}: {sorted(words)}" for line, words in word_sets(path)]
    return out


def test_the_off_words_live_in_core_units_only() -> None:
    assert off_word_copies(SRC) == [], "use torchhpc.core.units.is_off / OFF_WORDS"


def test_a_planted_copy_is_found(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text('FLAGS = ("0", "no", "off")\n')
    assert off_word_copies(tmp_path) == ["m.py:1: ['0', 'no', 'off']"]


def test_the_boots_copy_is_the_same_words() -> None:
    [(_, words)] = [w for w in word_sets(SRC / BOOT)]
    assert words == set(OFF_WORDS)


def test_the_exit_table_is_imported_from_its_home() -> None:
    """No module re-exports EXIT_CODES or exit_code_for, and none imports them from anywhere else."""
    bad = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module != "torchhpc.core.exitcodes":
                bad += [f"{rel}: from {node.module} import {a.name}" for a in node.names
                        if a.name in ("EXIT_CODES", "exit_code_for")]
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets) \
                    and rel != "core/exitcodes.py":
                names = {e.value for e in getattr(node.value, "elts", []) if isinstance(e, ast.Constant)}
                bad += [f"{rel}: __all__ re-exports {n}" for n in sorted(names & {"EXIT_CODES", "exit_code_for"})]
    assert bad == []


@pytest.mark.parametrize("text", ["off", "OFF", " 0 ", "no", "false", "none"])
def test_off_is_off_everywhere(text: str) -> None:
    assert is_off(text) and parse_timeout(text) == 0.0 and parse_switch(text, "x") is False


@pytest.mark.parametrize(("text", "seconds"), [("90", 90.0), ("7.5", 7.5), ("5m", 300.0), ("00:05:00", 300.0), (60, 60.0)])
def test_a_timeout_is_seconds_in_every_form_a_duration_takes(text: object, seconds: float) -> None:
    assert parse_timeout(text) == seconds


def test_one_message_per_mistake() -> None:
    with pytest.raises(SpecError) as under:
        parse_timeout("3")
    assert under.value.message == "--hang-timeout 3: a hang timeout under 5 seconds would call slow steps hangs"
    with pytest.raises(SpecError) as words:
        parse_timeout("soon")
    assert words.value.message == "--hang-timeout 'soon' is not a number of seconds"
    with pytest.raises(SpecError) as switch:
        parse_switch("maybe", "--opt exclusive")
    assert switch.value.message == "--opt exclusive='maybe' is not a boolean"
    assert set(ON_WORDS).isdisjoint(OFF_WORDS)


FILE_NAMES = ("end.json", "attempts.json", "checkpoint.json", "hang.json", "record.json")


def file_name_literals(root: Path) -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel in ("jobdir/layout.py", BOOT):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in FILE_NAMES:
                out.append(f"{rel}:{node.lineno}: {node.value!r}")
    return out


def test_job_directory_files_are_named_in_the_layout_module_only() -> None:
    assert file_name_literals(SRC) == [], "import the name from torchhpc.jobdir.layout"


def test_a_planted_file_name_is_found(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text('import os\nPATH = os.path.join("d", "checkpoint.json")\n')
    assert file_name_literals(tmp_path) == ["m.py:2: 'checkpoint.json'"]


@pytest.mark.parametrize("environ", [
    {"TORCHHPC_JOB_DIR": "/j"}, {"TORCHHPC_RANKS_DIR": "/j/ranks/"}, {"TORCHHPC_FR_DIR": "/j/fr"},
    {"TORCHHPC_JOB_DIR": "/a", "TORCHHPC_RANKS_DIR": "/b/ranks"}, {},
])
def test_the_boot_finds_the_job_directory_as_the_package_does(environ: dict[str, str]) -> None:
    from torchhpc.boot import sitecustomize as boot
    from torchhpc.jobdir import layout

    assert boot.job_dir(environ) == layout.job_dir_of(environ)
    assert (boot.ENDED_DIR, boot.flight_dir({"TORCHHPC_RANKS_DIR": "/j/ranks"})) == (layout.ENDED_DIR, f"/j/{layout.FR_DIR}")
