"""The constraints that protect a base image's torch, for real, in a throwaway venv.

A venv stands in for the base image: it gets ``fakebase 1.0`` (the "torch" that must
stay), built here as a wheel, like every other package in this test (no index is
used: ``--no-index --find-links``). ``needs-new-base`` wants ``fakebase==2.0``, which
*is* available: without constraints pip upgrades the base (the control, proving the
test can fail); with the generated constraints the install fails and 1.0 stays.
A compatible package still installs, and a merged ``/etc/pip/constraint.txt``-style
file is honoured. The recipes run exactly this script (constraints.py).
"""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from torchhpc.containers import constraints

SCRIPT = constraints.__file__


def make_wheel(dist: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> Path:
    """A minimal pure-Python wheel (one module), valid for pip."""
    mod = name.replace("-", "_")
    tag = f"{mod}-{version}"
    files = {
        f"{mod}/__init__.py": f"__version__ = {version!r}\n",
        f"{tag}.dist-info/METADATA": "Metadata-Version: 2.1\n"
        f"Name: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{tag}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: torchhpc-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{tag}.dist-info/RECORD,,")
    files[f"{tag}.dist-info/RECORD"] = "\n".join(record) + "\n"
    out = dist / f"{tag}-py3-none-any.whl"
    with zipfile.ZipFile(out, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    return out


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("constraints")
    wheels = root / "wheels"
    wheels.mkdir()
    make_wheel(wheels, "fakebase", "1.0")
    make_wheel(wheels, "fakebase", "2.0")
    make_wheel(wheels, "needs-new-base", "1.0", ("fakebase==2.0",))
    make_wheel(wheels, "likes-any-base", "1.0", ("fakebase>=1.0", "newdep"))
    make_wheel(wheels, "newdep", "1.0")
    make_wheel(wheels, "newdep", "2.0")
    return {"root": root, "wheels": wheels}


def pip_env() -> dict[str, str]:
    # This machine's pip config (extra indexes, global constraints) must not leak in.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def new_base(world: dict[str, Path], name: str) -> Path:
    """A fresh venv (no pip of its own: the test's pip drives it with --python) holding fakebase 1.0."""
    venv = world["root"] / name
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    pip(py, world, "fakebase==1.0", check=True)
    return py


def pip(py: Path, world: dict[str, Path], *args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "pip", "--python", str(py), "install", "--no-index",
            "--find-links", str(world["wheels"]), *args]
    return subprocess.run(argv, capture_output=True, text=True, env=pip_env(), check=check, timeout=300)


def version(py: Path, name: str) -> str | None:
    code = f"from importlib import metadata\ntry: print(metadata.version({name!r}))\nexcept Exception: print('')"
    out = subprocess.run([str(py), "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    return out or None


def freeze(py: Path, out: Path, *extra: str) -> str:
    subprocess.run([str(py), SCRIPT, "--output", str(out), *extra], check=True, timeout=60, env=pip_env())
    return out.read_text()


def test_control_without_constraints_the_base_is_replaced(world: dict[str, Path]) -> None:
    py = new_base(world, "control")
    r = pip(py, world, "needs-new-base")
    assert r.returncode == 0, r.stderr
    assert version(py, "fakebase") == "2.0"  # what silently happens to NGC's torch


def test_constraints_refuse_a_different_base_and_keep_it(world: dict[str, Path]) -> None:
    py = new_base(world, "protected")
    cfile = world["root"] / "protected-constraints.txt"
    text = freeze(py, cfile, "--no-merge")
    assert "fakebase==1.0" in text.splitlines()
    r = pip(py, world, "-c", str(cfile), "needs-new-base")
    assert r.returncode != 0
    said = r.stdout + r.stderr
    assert "fakebase" in said and "conflicting dependencies" in said
    assert version(py, "fakebase") == "1.0"
    assert version(py, "needs-new-base") is None
    # the recipe's final check agrees nothing changed
    ok = subprocess.run([str(py), SCRIPT, "--check", str(cfile)], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr


def test_compatible_package_installs_and_check_catches_a_change(world: dict[str, Path]) -> None:
    py = new_base(world, "compatible")
    cfile = world["root"] / "compatible-constraints.txt"
    freeze(py, cfile, "--no-merge")
    r = pip(py, world, "-c", str(cfile), "likes-any-base")
    assert r.returncode == 0, r.stderr
    assert version(py, "fakebase") == "1.0" and version(py, "newdep") == "2.0"
    added = subprocess.run([str(py), SCRIPT, "--added", str(cfile)], capture_output=True, text=True, check=True)
    assert added.stdout.split() == ["likes-any-base==1.0", "newdep==2.0"]
    # someone upgrades the base anyway (no -c): the build's check must fail, naming it
    pip(py, world, "--upgrade", "fakebase==2.0", check=True)
    bad = subprocess.run([str(py), SCRIPT, "--check", str(cfile)], capture_output=True, text=True)
    assert bad.returncode == 1
    assert "fakebase changed from 1.0 to 2.0" in bad.stderr


def test_image_constraint_file_is_merged(world: dict[str, Path]) -> None:
    """NGC's /etc/pip/constraint.txt: lines for packages not installed are kept and enforced."""
    py = new_base(world, "merged")
    image_file = world["root"] / "constraint.txt"
    image_file.write_text("# the image's own pins\nnewdep==1.0\nfakebase==0.9\n")
    cfile = world["root"] / "merged-constraints.txt"
    text = freeze(py, cfile, "--merge", str(image_file))
    lines = text.splitlines()
    assert "newdep==1.0" in lines and "fakebase==1.0" in lines
    assert "fakebase==0.9" not in lines  # installed version wins over the image file
    r = pip(py, world, "-c", str(cfile), "likes-any-base")
    assert r.returncode == 0, r.stderr
    assert version(py, "newdep") == "1.0"  # not the newest: the merged pin held
