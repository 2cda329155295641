"""Docs are code: the CLI reference is generated from --help and every command is in it."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest

import torchhpc
from tests.conftest import REPO, load_file


def _gen() -> object:
    return load_file(REPO / "scripts" / "gen_cli_docs.py")


def test_cli_reference_is_current() -> None:
    doc = (REPO / "docs" / "cli.md").read_text()
    fresh = _gen().render()  # type: ignore[attr-defined]
    assert doc == fresh, "docs/cli.md is stale: run `python scripts/gen_cli_docs.py` and commit it"


def test_every_command_documented() -> None:
    from torchhpc.cli.main import COMMANDS, build_parser

    doc = (REPO / "docs" / "cli.md").read_text()
    parser = build_parser()
    names = [a for a in parser._subparsers._group_actions[0].choices]  # type: ignore[union-attr]
    assert set(COMMANDS) <= set(names) | {"jobs"}
    for name in names:
        assert f"## `torchhpc {name}`" in doc, f"torchhpc {name} is undocumented"


def test_all_exports_resolve() -> None:
    for name in torchhpc.__all__:
        assert hasattr(torchhpc, name)
    import torchhpc.dist as d
    import torchhpc.env as e

    for mod in (d, e):
        for name in getattr(mod, "__all__", []):
            assert getattr(mod, name) is not None, f"{mod.__name__}.{name}"


def test_readme_commands_exist() -> None:
    readme = (REPO / "README.md").read_text()
    assert "./scripts/setup.sh && .venv/bin/torchhpc run -n 4 examples/pi.py" in readme
    assert "sudo ./scripts/test.sh" in readme
    assert (REPO / "scripts" / "test.sh").exists() and "scripts/test.sh" in (REPO / ".ci" / "run").read_text()
    assert Path(REPO / "examples" / "pi.py").exists()


# --- every `torchhpc ... --dry-run` command in the README and docs/ runs --------------------------------------

_DOC_FILES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```(sh|bash|console)\n(.*?)^```", re.S | re.M)


def shell_commands(text: str) -> list[tuple[int, str]]:
    """(line number, command) for each command in ```sh/```bash blocks (```console: the ``$ `` lines).

    A trailing ``\\`` joins the next line; comments are left for shlex to drop.
    """
    out: list[tuple[int, str]] = []
    for m in _FENCE.finditer(text):
        console = m.group(1) == "console"
        first = text.count("\n", 0, m.start(2)) + 1
        pending: tuple[int, str] | None = None
        for i, line in enumerate(m.group(2).splitlines()):
            if pending is not None:
                start, line = pending[0], f"{pending[1]} {line.strip()}"
            elif console and not line.startswith("$ "):
                continue  # the command's output
            else:
                start, line = first + i, line[2:] if console else line
            if line.rstrip().endswith("\\"):
                pending = (start, line.rstrip()[:-1].rstrip())
                continue
            pending = None
            out.append((start, line))
    return out


def dry_run_argvs(path: Path) -> list[tuple[str, list[str]]]:
    """``(file:line, argv after "torchhpc")`` of each documented command that renders without a cluster."""
    found = []
    for lineno, line in shell_commands(path.read_text()):
        words = shlex.split(line, comments=True)
        # Only dry runs: anything else needs a cluster, a network or a job around it; "..." marks an elided line.
        if words[:1] != ["torchhpc"] or "--dry-run" not in words or "..." in words:
            continue
        found.append((f"{path.relative_to(REPO)}:{lineno}", words[1:]))
    return found


_DRY_RUNS = [item for path in _DOC_FILES for item in dry_run_argvs(path)]


def test_shell_commands_extraction() -> None:
    text = (
        "x\n```sh\ntorchhpc run -n 2 a.py   # two ranks\ntorchhpc run --scheduler slurm \\\n"
        "    --dry-run b.py --x 'a # b'\n```\n```console\n$ torchhpc run --dry-run \\\n      c.py\noutput line\n```\n"
        "```python\ntorchhpc run --dry-run d.py\n```\n"
    )
    cmds = shell_commands(text)
    assert cmds == [
        (3, "torchhpc run -n 2 a.py   # two ranks"),
        (4, "torchhpc run --scheduler slurm --dry-run b.py --x 'a # b'"),
        (8, "torchhpc run --dry-run c.py"),
    ]
    assert shlex.split(cmds[1][1], comments=True)[-1] == "a # b"
    assert shlex.split(cmds[0][1], comments=True) == ["torchhpc", "run", "-n", "2", "a.py"]


def test_readme_dry_runs_found() -> None:
    readme = [argv for where, argv in _DRY_RUNS if where.startswith("README.md:")]
    assert len(readme) >= 8, readme
    assert any("lumi" in argv for argv in readme)


@pytest.mark.parametrize("argv", [argv for _, argv in _DRY_RUNS], ids=[where for where, _ in _DRY_RUNS])
def test_documented_dry_run_works(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """As a reader would type it, from the repository root, with no config of their own: exit 0."""
    from torchhpc.cli.main import main

    for name in list(os.environ):
        if name.startswith(("TORCHHPC_", "SLURM_", "SBATCH_", "PBS_")) or name == "XDG_CONFIG_HOME":
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(REPO)
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 0, f"torchhpc {shlex.join(argv)} exited {rc}:\n{err}"
