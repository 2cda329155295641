"""The import layers hold: every ``import`` in src/torchhpc (lazy ones inside functions too) points down.

    errors  <  torchhpc/__init__ (the version)  <  core  <  env | network | containers | launchers
    <  jobdir  <  schedulers | dist | profiles | devcluster  <  bench | config | diagnose | refusals
    <  resolve | doctor | supervisor | observe  <  job  <  sweep | functions  <  cli  <  __main__

A package may import itself and anything in a lower layer; packages of one
layer do not import each other (env, network, containers and launchers stay
independent, and so do the backends' neighbours). A new top-level package or
module must be given a layer here.

Below the layers, modules: no import circle between any two modules of src (lazy,
``TYPE_CHECKING`` and ``import_module`` imports count, and ``from package import
module`` imports the package's ``__init__`` too), and no module outside
``schedulers/`` imports a backend's package: it asks the registry; the top of ``schedulers/``
does not import ``schedulers/batch/`` (what only Slurm and PBS share). No module is over 450
lines. docs/architecture.md draws the same rules.
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
        "jobdir",  # what a job leaves on disk: record, never-overwrite writer, rank logs
        "schedulers dist profiles devcluster",
        "bench config diagnose refusals",  # diagnose: the failure verdict and the hang watch (jobdir, core); refusals: resolve's checks
        "resolve doctor supervisor observe",  # supervisor: the in-allocation restart loop; observe: top (diagnose)
        "job remote",  # remote: --remote's shipping and ssh forwarding (config, resolve, profiles)
        "sweep functions pipeline",  # functions: Executor (job), the pickle, the rank entry (env, dist), Stop/Checkpoint
        "cli",
        "__main__",
    )
)
RANK = {name: i for i, layer in enumerate(LAYERS) for name in layer}


def unit(parts: tuple[str, ...]) -> str:
    """The layer unit of ``torchhpc.A.B``: ``A`` (the root package itself is ``__init__``)."""
    return parts[0] if parts else "__init__"


def dynamic_target(node: ast.AST) -> str | None:
    """The module an ``importlib.import_module(...)`` call names: a string literal, or an f-string's
    constant head (``f"torchhpc.cli.{name}"`` -> ``torchhpc.cli.``: some module of that package)."""
    if not (isinstance(node, ast.Call) and node.args):
        return None
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    if name != "import_module":
        return None
    arg = node.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        return str(arg.values[0].value)
    return None


def imports(
    path: Path, root: Path = SRC, names_too: bool = False, typing_too: bool = True,
) -> list[tuple[int, tuple[str, ...]]]:
    """(line, module path below torchhpc) for every torchhpc import in ``path``, at any depth, and
    every ``importlib.import_module`` target it names (a package's ``torchhpc.x.`` prefix ends in "").
    ``names_too``: ``from torchhpc.a import b`` also yields ``a.b`` (b may be a module).
    ``typing_too``: ``if TYPE_CHECKING:`` imports count (they never run, but a type that names a
    higher layer is a dependency all the same)."""
    package = path.relative_to(root).parts[:-1]  # a module's package; an __init__'s own package
    found: list[tuple[int, tuple[str, ...]]] = []
    tree = ast.parse(path.read_text(), str(path))
    typing_only = set() if typing_too else {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for stmt in node.body
        for inner in ast.walk(stmt)
    }
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        names: list[str] = []
        target = dynamic_target(node)
        if target is not None:
            names = [target]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ("torchhpc", *package[: len(package) - node.level + 1])
                names = [".".join([*base, *([node.module] if node.module else [])])]
            else:
                names = [node.module or ""]
            if names_too:
                names += [f"{names[0]}.{a.name}" for a in node.names]
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


def module_of(path: Path, root: Path = SRC) -> tuple[str, ...]:
    """``schedulers/local.py`` -> ``("schedulers", "local")``; a package's ``__init__`` is the package."""
    parts = path.relative_to(root).with_suffix("").parts
    return parts[:-1] if parts[-1] == "__init__" else parts


def module_graph(root: Path = SRC) -> dict[tuple[str, ...], set[tuple[str, ...]]]:
    """Every module -> the modules it imports, at module level: lazy imports, ``TYPE_CHECKING`` imports
    and ``import_module`` targets all count (an import that runs later is still a dependency).

    ``from torchhpc.a import b`` where ``b`` is a module is an edge to ``a`` (its ``__init__`` runs
    and hands ``b`` over) and to ``a.b``; a target like ``("cli", "")`` (an f-string's package prefix)
    stands for every module of that package.
    """
    paths = sorted(root.rglob("*.py"))
    modules = {module_of(p, root) for p in paths}
    graph: dict[tuple[str, ...], set[tuple[str, ...]]] = {m: set() for m in modules}
    for path in paths:
        here = module_of(path, root)
        for _line, target in imports(path, root, names_too=True, typing_too=True):
            if target and target[-1] == "":
                found = {m for m in modules if m[: len(target) - 1] == target[:-1] and len(m) == len(target)}
            else:
                # "from torchhpc.a import b" names a module a.b or an attribute of a: the longest module
                found = {max((target[:i] for i in range(len(target), 0, -1) if target[:i] in modules), key=len, default=())}
            graph[here] |= found - {(), here}
    return graph


def circles(root: Path = SRC) -> list[str]:
    """Every import circle between modules of src (strongly connected groups of two or more), sorted."""
    graph = module_graph(root)
    index: dict[tuple[str, ...], int] = {}
    low: dict[tuple[str, ...], int] = {}
    stack: list[tuple[str, ...]] = []
    groups: list[str] = []

    def strong(v: tuple[str, ...]) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = [stack.pop()]
            while group[-1] != v:
                group.append(stack.pop())
            if len(group) > 1:
                groups.append(" <-> ".join(sorted(".".join(m) or "torchhpc" for m in group)))

    for module in sorted(graph):
        if module not in index:
            strong(module)
    return sorted(groups)


BACKENDS = ("local", "slurm", "pbs", "kubernetes", "runai")


def backend_reach(root: Path = SRC) -> list[str]:
    """Imports of a backend's modules from outside ``schedulers/``: the registry is the only way in.

    Inside ``schedulers/`` a backend may build on another (RunAI's pods are Kubernetes pods).
    """
    bad: list[str] = []
    for path in sorted(root.rglob("*.py")):
        here = path.relative_to(root).parts
        if here[0] == "schedulers":
            continue
        for line, target in imports(path, root, typing_too=True):
            if target[:1] == ("schedulers",) and len(target) > 1 and target[1] in BACKENDS:
                bad.append(f"{'/'.join(here)}:{line}: imports torchhpc.{'.'.join(target)}; ask the registry (get_scheduler)")
    return bad


def test_every_import_points_down() -> None:
    assert violations() == []


def test_no_import_circle() -> None:
    assert circles() == []


def test_backends_are_reached_through_the_registry() -> None:
    assert backend_reach() == []


def test_a_planted_circle_fails(tmp_path: Path) -> None:
    """Lazy imports and importlib.import_module targets (literal and f-string) close a circle too."""
    tree = tmp_path / "torchhpc"
    (tree / "pkg").mkdir(parents=True)
    (tree / "pkg" / "__init__.py").write_text("")
    (tree / "pkg" / "a.py").write_text("def f():\n    from torchhpc.pkg import b\n")
    (tree / "pkg" / "b.py").write_text("import importlib\nM = importlib.import_module('torchhpc.pkg.a')\n")
    (tree / "pkg" / "c.py").write_text("import importlib\ndef g(n):\n    return importlib.import_module(f'torchhpc.pkg.{n}')\n")
    (tree / "pkg" / "d.py").write_text("from torchhpc.pkg.c import g\n")
    assert circles(tree) == ["pkg.a <-> pkg.b", "pkg.c <-> pkg.d"], circles(tree)


def test_type_only_and_package_imports_close_a_circle(tmp_path: Path) -> None:
    """A ``TYPE_CHECKING`` import is an edge; so is ``from package import module`` to the package's
    ``__init__``; modules of different packages close a circle as well as siblings do."""
    tree = tmp_path / "torchhpc"
    for pkg in ("p", "q"):
        (tree / pkg).mkdir(parents=True)
    (tree / "p" / "__init__.py").write_text("from torchhpc.p.a import A\n")
    (tree / "p" / "a.py").write_text("from torchhpc.p import b\nA = 1\n")
    (tree / "p" / "b.py").write_text("")
    (tree / "q" / "__init__.py").write_text("")
    (tree / "q" / "x.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from torchhpc.q.y import Y\n")
    (tree / "q" / "y.py").write_text("def f():\n    from torchhpc.p.b import B\n    from torchhpc.q import x\n")
    assert circles(tree) == ["p <-> p.a", "q.x <-> q.y"], circles(tree)


def test_a_planted_backend_import_fails(tmp_path: Path) -> None:
    """Outside schedulers/ a backend is reached through the registry, even for a type."""
    tree = tmp_path / "torchhpc"
    (tree / "job").mkdir(parents=True)
    (tree / "schedulers" / "pbs").mkdir(parents=True)
    (tree / "schedulers" / "batch.py").write_text("from torchhpc.schedulers.pbs.parse import P\n")
    (tree / "job" / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from torchhpc.schedulers.slurm import slurm\n")
    (tree / "job" / "b.py").write_text("from torchhpc.schedulers import get_scheduler\n")
    assert backend_reach(tree) == [
        "job/a.py:3: imports torchhpc.schedulers.slurm; ask the registry (get_scheduler)",
    ], backend_reach(tree)


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


# The client commands of the schedulers torchhpc drives: only their own rooms build them.
SCHEDULER_COMMANDS = frozenset(
    "srun scontrol squeue scancel sacct sbatch salloc sinfo sacctmgr sdiag qsub qstat qdel qrerun pbsdsh "
    "pbsnodes kubectl runai".split()
)
COMMAND_ROOMS = frozenset({"schedulers", "devcluster", "launchers"})


def scheduler_commands(root: Path = SRC) -> list[str]:
    """``path:line: srun`` for each list or tuple literal outside schedulers/, devcluster/ and launchers/
    whose first item is a scheduler's client command: the supervisor, top, the hang probe and doctor
    ask the job's allocation (schedulers/allocation.py) instead of writing ``srun --overlap`` again."""
    bad = []
    for path in sorted(root.rglob("*.py")):
        here = path.relative_to(root).parts
        if here[0] in COMMAND_ROOMS:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.List, ast.Tuple)) and node.elts:
                first = node.elts[0]
                if isinstance(first, ast.Constant) and first.value in SCHEDULER_COMMANDS:
                    bad.append(f"{'/'.join(here)}:{node.lineno}: {first.value}")
    return bad


def test_only_the_scheduler_rooms_build_scheduler_commands() -> None:
    assert scheduler_commands() == []


def test_a_planted_scheduler_command_fails(tmp_path: Path) -> None:
    tree = tmp_path / "torchhpc"
    for room in ("supervisor", "observe", "schedulers"):
        (tree / room).mkdir(parents=True)
    (tree / "supervisor" / "a.py").write_text('def f(j):\n    return ["scancel", "--signal=KILL", j]\n')
    (tree / "observe" / "b.py").write_text('X = ("qstat", "-f")\nY = ["echo", "srun"]\nZ = ("pbsdsh",)\n')
    (tree / "schedulers" / "c.py").write_text('X = ["srun", "--overlap"]\n')
    assert scheduler_commands(tree) == ["observe/b.py:1: qstat", "observe/b.py:3: pbsdsh", "supervisor/a.py:2: scancel"]


MAX_LINES = 450  # house style: modules of a few hundred lines


def long_modules(root: Path = SRC, limit: int = MAX_LINES) -> list[str]:
    """``path: N lines`` for every module of src over ``limit`` lines: split it by what it does."""
    counts = ((path, len(path.read_text().splitlines())) for path in sorted(root.rglob("*.py")))
    return [f"{path.relative_to(root)}: {n} lines (over {limit})" for path, n in counts if n > limit]


def batch_reach(root: Path = SRC) -> list[str]:
    """Imports of ``schedulers/batch/`` from the top of ``schedulers/`` (the contract, the registry,
    waiting, dependencies): batch/ is what Slurm and PBS share, below them, and the contract does not
    reach down into it. (Outside ``schedulers/``, :func:`backend_reach` and the layers keep it out.)"""
    bad: list[str] = []
    for path in sorted((root / "schedulers").glob("*.py")):
        for line, target in imports(path, root, names_too=True):
            if target[:2] == ("schedulers", "batch"):
                bad.append(f"schedulers/{path.name}:{line}: imports torchhpc.{'.'.join(target)}")
    return bad


def test_no_module_is_over_450_lines() -> None:
    assert long_modules() == []


def test_the_top_of_schedulers_does_not_import_batch() -> None:
    assert batch_reach() == []


def test_planted_long_module_and_batch_import_fail(tmp_path: Path) -> None:
    tree = tmp_path / "torchhpc"
    (tree / "schedulers" / "batch").mkdir(parents=True)
    (tree / "schedulers" / "api.py").write_text("def f():\n    from torchhpc.schedulers.batch import base\n")
    (tree / "schedulers" / "batch" / "base.py").write_text("from torchhpc.schedulers.api import f\n" + "x = 1\n" * 450)
    assert long_modules(tree) == ["schedulers/batch/base.py: 451 lines (over 450)"]
    assert batch_reach(tree) == ["schedulers/api.py:2: imports torchhpc.schedulers.batch",
                                 "schedulers/api.py:2: imports torchhpc.schedulers.batch.base"]
