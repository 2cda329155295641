"""The import layers hold: every ``import`` in src/torchhpc (lazy ones inside functions too) points down.

    errors  <  torchhpc/__init__ (the version)  <  core  <  env | network | containers | launchers
    <  schedulers | dist | profiles | devcluster  <  bench | config  <  resolve | doctor  <  job
    <  cli  <  __main__

A package may import itself and anything in a lower layer; packages of one
layer do not import each other (env, network, containers and launchers stay
independent, and so do the backends' neighbours). A new top-level package or
module must be given a layer here.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

SRC = REPO / "src" / "torchhpc"

LAYERS: tuple[frozenset[str], ...] = tuple(
    frozenset(names.split())
    for names in (
        "errors boot",  # boot: the stdlib-only rank sitecustomize (launchers/boot.py), imports nothing of ours
        "__init__",
        "core",
        "env network containers launchers",
        "schedulers dist profiles devcluster",
        "bench config",
        "resolve doctor",
        "job",
        "sweep",
        "cli",
        "__main__",
    )
)
RANK = {name: i for i, layer in enumerate(LAYERS) for name in layer}


def unit(parts: tuple[str, ...]) -> str:
    """The layer unit of ``torchhpc.A.B``: ``A`` (the root package itself is ``__init__``)."""
    return parts[0] if parts else "__init__"


def imports(path: Path, root: Path = SRC) -> list[tuple[int, tuple[str, ...]]]:
    """(line, module path below torchhpc) for every torchhpc import in ``path``, at any depth."""
    package = path.relative_to(root).parts[:-1]  # a module's package; an __init__'s own package
    found: list[tuple[int, tuple[str, ...]]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ("torchhpc", *package[: len(package) - node.level + 1])
                names = [".".join([*base, *([node.module] if node.module else [])])]
            else:
                names = [node.module or ""]
        for name in names:
            parts = name.split(".")
            if parts[0] == "torchhpc":
                found.append((node.lineno, tuple(parts[1:])))
    return found


def violations(root: Path = SRC) -> list[str]:
    bad: list[str] = []
    for path in sorted(root.rglob("*.py")):
        here = unit(path.relative_to(root).with_suffix("").parts)
        if here not in RANK:
            bad.append(f"{path.relative_to(root)}: {here!r} is in no layer (add it to LAYERS in {__file__})")
            continue
        for line, target in imports(path, root):
            there = unit(target)
            if there == here:
                continue
            if there not in RANK:
                bad.append(f"{path.relative_to(root)}:{line}: imports torchhpc.{'.'.join(target)}, in no layer")
            elif RANK[there] >= RANK[here]:
                how = "a sibling in its own layer" if RANK[there] == RANK[here] else "a higher layer"
                bad.append(f"{path.relative_to(root)}:{line}: {here} imports torchhpc.{'.'.join(target)}, {how}")
    return bad


def test_every_import_points_down() -> None:
    assert violations() == []


def test_a_planted_import_against_the_layers_fails(tmp_path: Path) -> None:
    """The walker sees lazy imports inside functions, relative imports and sibling imports."""
    import shutil

    tree = tmp_path / "torchhpc"
    shutil.copytree(SRC, tree)
    (tree / "core" / "planted.py").write_text("def f():\n    from torchhpc.schedulers import slurm\n")
    (tree / "network" / "planted.py").write_text("from ..containers import wrap\n")
    (tree / "schedulers" / "planted.py").write_text("import torchhpc.cli.main\n")
    bad = violations(tree)
    assert bad == [
        "core/planted.py:2: core imports torchhpc.schedulers, a higher layer",
        "network/planted.py:1: network imports torchhpc.containers, a sibling in its own layer",
        "schedulers/planted.py:1: schedulers imports torchhpc.cli.main, a higher layer",
    ], bad
