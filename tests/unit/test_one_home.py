"""One idea, one home (issue 69): the "off" words and the duration grammar live in core/units.py, the exit
table in core/exitcodes.py. A copy elsewhere drifts (the off words were 7 copies as 3 different sets; the
exit table was re-exported by two modules and imported through them). The stdlib-only rank boot keeps its
own copy of the off words: held equal here."""

from __future__ import annotations

import ast
from collections.abc import Iterator
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


def sources(root: Path, homes: set[str]) -> Iterator[tuple[str, ast.AST]]:
    """(path relative to ``root``, parsed module) of every module below ``root`` but the ``homes``."""
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel not in homes:
            yield rel, ast.parse(path.read_text())


def word_sets(tree: ast.AST) -> list[tuple[int, set[str]]]:
    """Literal tuples, sets and lists of strings that hold "off" beside another off word."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Tuple, ast.Set, ast.List)):
            words = {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
            if "off" in words and words & {"0", "false", "no", "none"}:
                found.append((node.lineno, words))
    return found


def off_word_copies(root: Path) -> list[str]:
    return [f"{rel}:{line}: {sorted(words)}" for rel, tree in sources(root, HOME | NOT_SWITCHES | {BOOT})
            for line, words in word_sets(tree)]


def test_the_off_words_live_in_core_units_only() -> None:
    assert off_word_copies(SRC) == [], "use torchhpc.core.units.is_off / OFF_WORDS"


def test_a_planted_copy_is_found(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text('FLAGS = ("0", "no", "off")\n')
    assert off_word_copies(tmp_path) == ["m.py:1: ['0', 'no', 'off']"]


def test_the_boots_copy_is_the_same_words() -> None:
    [(_, words)] = [w for w in word_sets(ast.parse((SRC / BOOT).read_text()))]
    assert words == set(OFF_WORDS)


def test_the_exit_table_is_imported_from_its_home() -> None:
    """No module re-exports EXIT_CODES or exit_code_for, and none imports them from anywhere else."""
    bad = []
    for rel, tree in sources(SRC, set()):
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
    return [f"{rel}:{node.lineno}: {node.value!r}" for rel, tree in sources(root, {"jobdir/layout.py", BOOT})
            for node in ast.walk(tree) if isinstance(node, ast.Constant) and node.value in FILE_NAMES]


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


def inline_handles(root: Path) -> list[str]:
    """f-strings that spell a handle themselves: ``{name}:{job_id}``, ``local:{job_id}`` (core/handle.py's job)."""
    out = []
    for rel, tree in sources(root, {"core/handle.py"}):
        for node in ast.walk(tree):
            if not isinstance(node, ast.JoinedStr):
                continue
            parts = node.values
            for before, colon, after in zip(parts, parts[1:], parts[2:]):
                job = isinstance(after, ast.FormattedValue) and ast.unparse(after.value).split(".")[-1] in ("job_id", "job")
                text = colon.value if isinstance(colon, ast.Constant) and isinstance(colon.value, str) else ""
                named = isinstance(before, ast.FormattedValue) and text == ":"
                if job and (named or text.endswith(("local:", "slurm:", "pbs:"))):
                    out.append(f"{rel}:{node.lineno}")
            if len(parts) >= 2 and isinstance(parts[0], ast.Constant) and str(parts[0].value).endswith(("local:", "slurm:")) \
                    and isinstance(parts[1], ast.FormattedValue) and ast.unparse(parts[1].value).split(".")[-1] == "job_id":
                out.append(f"{rel}:{node.lineno}")
    return sorted(set(out))


def test_handles_are_parsed_and_printed_by_one_type() -> None:
    assert inline_handles(SRC) == [], "use torchhpc.core.handle.Handle (str(Handle(name, job_id)))"


def test_a_planted_inline_handle_is_found(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text('def f(name, job_id):\n    return f"no job {name}:{job_id}", f"local:{job_id}"\n')
    assert inline_handles(tmp_path) == ["m.py:2"]


def test_a_handle_round_trips_and_a_mistyped_scheduler_is_named() -> None:
    from torchhpc.core.handle import Handle
    from torchhpc.errors import UsageError

    assert str(Handle.parse("slurm:123_4", "local")) == "slurm:123_4"
    assert Handle.parse("3f2a", "local") == Handle("local", "3f2a")
    with pytest.raises(UsageError) as e:
        Handle.parse("slrum:1", "local", ("local", "slurm", "pbs"))
    assert e.value.hint == "did you mean slurm:1?"


# A local job's run id prefix: schedulers/local/allocation.py (RUN_PREFIX, run_id_of). The node-side probe is
# stdlib only and runs without torchhpc's imports: a copy, held equal below.
RUN_ID_HOME = {"schedulers/local/allocation.py"}
PROBE = "diagnose/probe.py"


def run_prefix_copies(root: Path) -> list[str]:
    """String literals (f-string parts included) that start with the local run id's prefix."""
    from torchhpc.schedulers.local.allocation import RUN_PREFIX

    return [f"{rel}:{node.lineno}: {node.value!r}" for rel, tree in sources(root, RUN_ID_HOME | {PROBE})
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith(RUN_PREFIX)]


def test_the_local_run_id_is_spelled_in_its_home_only(tmp_path: Path) -> None:
    assert run_prefix_copies(SRC) == [], "use torchhpc.schedulers.local.allocation.run_id_of / RUN_PREFIX"
    (tmp_path / "m.py").write_text('def f(i):\n    return f"local-{i}"\n')
    assert run_prefix_copies(tmp_path) == ["m.py:2: 'local-'"]


def test_the_probes_copy_is_the_same_prefix() -> None:
    from torchhpc.schedulers.local.allocation import RUN_PREFIX

    assert f'.startswith("{RUN_PREFIX}")' in (SRC / PROBE).read_text()
