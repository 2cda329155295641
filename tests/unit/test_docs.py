"""Docs are code: the CLI reference is generated from --help and every command is in it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torchhpc
from tests.conftest import REPO


def _gen() -> object:
    spec = importlib.util.spec_from_file_location("gen_cli_docs", REPO / "scripts" / "gen_cli_docs.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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
