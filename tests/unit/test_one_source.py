"""One source for each fact (issue 25): launchers own their behaviour, schedulers ask them.

- no module outside ``launchers/`` and a backend's own package compares launcher or scheduler names
  (``==``, ``!=``, ``in``, on ``.name`` too): it asks the launcher or the scheduler class;
- Slurm and PBS reserve the same CPUs per node for the same job (one rule, Launcher.cpus_per_task);
- ``torchhpc shell``'s ``salloc`` is rendered from the same checked options as the batch script,
  so it refuses what ``sbatch`` would refuse and asks for what ``#SBATCH`` asks for;
- option defaults are read from their declaration (changing one changes every render).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.fakes import FakeRunner
from torchhpc.core.launcher_kind import LauncherKind
from torchhpc.core.spec import Entrypoint, JobSpec
from torchhpc.errors import SpecError
from torchhpc.jobdir.logs import filter_rank, parse_line
from torchhpc.launchers import LAUNCHERS, MPIRUN, SRUN, TORCHRUN, launcher_of
from torchhpc.schedulers.pbs.pbs import PBSScheduler
from torchhpc.schedulers.slurm.slurm import SlurmScheduler

SRC = REPO / "src" / "torchhpc"
# the names a comparison must not test outside their own homes: every scheduler's and launcher's
NAMES = frozenset({"local", "slurm", "pbs", "kubernetes", "runai", *LAUNCHERS})
BACKENDS = ("local", "slurm", "pbs", "kubernetes", "runai")


def _names_in(node: ast.AST) -> set[str]:
    """The scheduler/launcher names a comparison operand spells: a string, or a tuple/list/set of them."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value} & NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return {name for e in node.elts for name in _names_in(e)}
    return set()


def _allowed(rel: str) -> bool:
    """A launcher compares launcher names in launchers/; a backend compares names in its own package."""
    return rel.startswith("launchers/") or any(rel.startswith(f"schedulers/{b}/") for b in BACKENDS)


def name_checks(root: Path = SRC) -> list[str]:
    """Every comparison (``==``, ``!=``, ``in``, ``not in``, on a variable or a ``.name``) against a
    scheduler or launcher name, outside the places allowed to make one: an AST walk, not a regex,
    so neither spacing nor the operator hides one."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if _allowed(rel):
            continue
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            if isinstance(node, ast.Compare) and any(_names_in(x) for x in (node.left, *node.comparators)):
                found.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_compares_launcher_or_scheduler_names() -> None:
    assert name_checks() == [], "ask the launcher (launcher_of(spec)) or the scheduler class instead"


def test_a_planted_name_check_is_found(tmp_path: Path) -> None:
    for d in ("job", "launchers", "schedulers/slurm", "schedulers"):
        (tmp_path / d).mkdir(parents=True, exist_ok=True)
    (tmp_path / "job" / "a.py").write_text(
        'if spec.launcher == "srun":\n    pass\n'
        'if "slurm"!=sched.name:\n    pass\n'
        'x = spec.scheduler in ("kubernetes", "runai")\n'
        'y = name not in {"local"}\n'
        'z = spec.scheduler == "something else"\n'
    )
    (tmp_path / "schedulers" / "x.py").write_text('ok = n == "local"\n')  # the contract is no backend
    (tmp_path / "launchers" / "y.py").write_text('if launcher == "srun":\n    pass\n')
    (tmp_path / "schedulers" / "slurm" / "z.py").write_text('if spec.launcher != "torchrun":\n    pass\n')
    assert name_checks(tmp_path) == [
        "job/a.py:1: spec.launcher == 'srun'",
        "job/a.py:3: 'slurm' != sched.name",
        "job/a.py:5: spec.scheduler in ('kubernetes', 'runai')",
        "job/a.py:6: name not in {'local'}",
        "schedulers/x.py:1: n == 'local'",
    ]


def spec(**kw: object) -> JobSpec:
    base: dict[str, object] = dict(
        entrypoint=Entrypoint.parse(["examples/pi.py"], python="python3"),
        nodes=2, nproc_per_node=4, name="pi", output_dir="/scratch/out",
    )
    base.update(kw)
    return JobSpec(**base)  # type: ignore[arg-type]


def test_launcher_is_typed_and_strings_convert_at_the_boundary() -> None:
    s = spec(launcher="srun")
    assert s.launcher is LauncherKind.SRUN and launcher_of(s) is SRUN
    assert f"{s.launcher}" == "srun" and s.with_(launcher="mpirun").launcher is LauncherKind.MPIRUN
    with pytest.raises(SpecError, match="--launcher 'pmix' is not a launcher"):
        spec(launcher="pmix")


def _slurm_cpus_per_node(script: str) -> int:
    tasks = int(re.search(r"^#SBATCH --ntasks-per-node=(\d+)$", script, re.M).group(1))  # type: ignore[union-attr]
    cpus = int(re.search(r"^#SBATCH --cpus-per-task=(\d+)$", script, re.M).group(1))  # type: ignore[union-attr]
    return tasks * cpus


def _pbs_ncpus(script: str) -> int:
    return int(re.search(r"(?:ncpus|ppn)=(\d+)", script).group(1))  # type: ignore[union-attr]


@pytest.mark.parametrize("launcher", ["torchrun", "mpirun"])
@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        ({}, 4),  # one CPU per process, 4 processes
        ({"cpus_per_task": 2}, 8),
        ({"gpus_per_node": 4, "cpus_per_gpu": 8}, 32),
        # the case: --cpus-per-proc 2 is what the user asked for; a site's cpus_per_gpu is
        # only a default (PBS used to take the larger: ncpus=32 beside Slurm's 8)
        ({"cpus_per_task": 2, "gpus_per_node": 4, "cpus_per_gpu": 8}, 8),
    ],
)
@pytest.mark.parametrize("style", ["pro", "torque"])
def test_slurm_and_pbs_reserve_the_same_cpus(launcher: str, kw: dict[str, int], expected: int, style: str) -> None:
    slurm = SlurmScheduler(runner=FakeRunner()).render(spec(launcher=launcher, scheduler="slurm", **kw)).script or ""
    pbs = PBSScheduler(runner=FakeRunner()).render(
        spec(launcher=launcher, scheduler="pbs", options=(("select_style", style),), **kw)
    ).script or ""
    assert _slurm_cpus_per_node(slurm) == _pbs_ncpus(pbs) == expected


BAD_OPTIONS = [
    (("exclusive", "maybe"), "exclusive .*'maybe' is not"),
    (("partiton", "gpu"), "unknown slurm option"),
]


@pytest.mark.parametrize(("option", "message"), BAD_OPTIONS)
def test_salloc_refuses_what_the_batch_script_refuses(option: tuple[str, str], message: str) -> None:
    s = spec(scheduler="slurm", options=(option,))
    sched = SlurmScheduler(runner=FakeRunner())
    with pytest.raises(SpecError, match=message):
        sched.render(s)
    with pytest.raises(SpecError, match=message):
        sched.shell_argv(s)


def test_salloc_asks_for_what_sbatch_asks_for() -> None:
    """--gres replaces --gpus-per-node in both; --constraint, --exclusive and the rest reach salloc too."""
    s = spec(
        scheduler="slurm", gpus_per_node=4, mem="64G", time="01:00:00",
        options=(("gres", "gpu:a100:4"), ("constraint", "a100"), ("exclusive", "1"), ("partition", "gpu"),
                 ("nodelist", "n[1-2]")),
    )
    sched = SlurmScheduler(runner=FakeRunner())
    script = sched.render(s).script or ""
    sbatch = {line.split(None, 1)[1] for line in script.splitlines() if line.startswith("#SBATCH ")}
    salloc = sched.shell_argv(s)
    asked = set(salloc[1:salloc.index("srun")])
    wanted = {"--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=4", "--gres=gpu:a100:4", "--constraint=a100",
              "--exclusive", "--partition=gpu", "--nodelist=n[1-2]", "--mem=64G", "--time=01:00:00"}
    assert wanted <= sbatch and asked == wanted
    assert not any(a.startswith("--gpus-per-node") for a in salloc)


def test_defaults_live_in_their_declaration(monkeypatch: pytest.MonkeyPatch) -> None:
    """Change a declared default and the render follows: no use site restates it."""
    from dataclasses import replace

    options = dict(PBSScheduler.OPTIONS)
    options["place"] = replace(options["place"], default="pack")
    options["mca"] = replace(options["mca"], default="btl=tcp")
    monkeypatch.setattr(PBSScheduler, "OPTIONS", options)
    script = PBSScheduler(runner=FakeRunner()).render(spec(launcher="mpirun", scheduler="pbs")).script or ""
    assert "#PBS -l place=pack" in script and "-mca btl tcp" in script
    assert "scatter" not in script and "openib" not in script


def test_each_launcher_states_its_own_facts() -> None:
    assert [launcher.name for launcher in LAUNCHERS.values()] == [k.value for k in LauncherKind]
    assert (TORCHRUN.rank_vars, SRUN.rank_vars) == ("RANK", "SLURM_PROCID")
    assert MPIRUN.rank_vars.split()[0] == "OMPI_COMM_WORLD_RANK"
    s = spec(launcher="torchrun")
    assert (TORCHRUN.tasks_per_node(s), SRUN.tasks_per_node(s)) == (1, 4)


@pytest.mark.parametrize(
    ("launcher", "line", "rank"),
    [
        ("srun", "5: hello\n", 5),
        ("mpirun", "[1,6]<stdout>: hello\n", 6),
        ("torchrun", "1: [rank7]: hello\n", 7),
        ("torchrun", "1: [default3]: hello\n", 7),  # node 1 x 4 per node + local 3
    ],
)
def test_one_tag_parser_serves_logs_and_rank_filters(launcher: str, line: str, rank: int) -> None:
    """`torchhpc logs` (parse_line) and `logs --rank` on an output file (filter_rank) read one parser."""
    assert launcher_of(spec(launcher=launcher)).parse_tag(line.rstrip("\n"), 4) == (rank, "hello")
    assert parse_line(line, launcher, 4).rank == rank
    assert filter_rank(line + "0: other\n", rank, launcher, 4) == line
