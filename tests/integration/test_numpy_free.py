"""A venv with torch but no numpy: the benchmark and the prepare-once helper still run.

numpy is installed here, so its absence is simulated: a ``sitecustomize`` on
PYTHONPATH sets ``sys.modules['numpy'] = None`` in every rank, which makes
``import numpy`` raise exactly as in a torch-only venv, and makes torch's own
``tensor.numpy()`` fail with "Numpy is not available" (checked first, so the
simulation is known to bite). Everything else is real: two gloo ranks under
``torchhpc run -n 2``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import need

need("torch")
pytestmark = pytest.mark.slow


def _env(tmp_path: Path) -> dict[str, str]:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text("import sys\nsys.modules['numpy'] = None  # a torch-only venv\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHHPC_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH", "")) if p)
    return env


def _run(argv: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=300)


def test_simulation_bites(tmp_path: Path) -> None:
    probe = "import torch\ntry:\n    torch.zeros(1).numpy()\nexcept RuntimeError as e:\n    print(e)\n"
    cp = _run([sys.executable, "-c", probe], tmp_path)
    assert "Numpy is not available" in cp.stdout, cp.stdout + cp.stderr


def test_bench_and_main_first_without_numpy(tmp_path: Path) -> None:
    bench = _run([sys.executable, "-m", "torchhpc", "run", "-n", "2", "-m", "torchhpc.bench",
                  "all_reduce", "-b", "1K", "-e", "4K", "-f", "4", "-n", "2", "-w", "1"], tmp_path)
    out = bench.stdout + bench.stderr
    assert bench.returncode == 0, out
    assert "Numpy is not available" not in out and "# Out of bounds values : 0 OK" in out, out

    script = tmp_path / "prep.py"
    script.write_text(textwrap.dedent("""
        import socket
        import torchhpc.dist as thd
        from torchhpc.dist.sync import all_gather_objects
        with thd.init() as ctx:
            with ctx.main_first(local=True) as first:
                pass
            got = all_gather_objects({"rank": ctx.rank, "host": socket.gethostname(), "blob": "x" * (100 * ctx.rank)})
            print(f"rank {ctx.rank} first={first} got={[(g['rank'], len(g['blob'])) for g in got]}", flush=True)
    """))
    cp = _run([sys.executable, "-m", "torchhpc", "run", "-n", "2", str(script)], tmp_path)
    out = cp.stdout + cp.stderr
    assert cp.returncode == 0, out
    for r in (0, 1):
        assert f"rank {r} first={r == 0} got=[(0, 0), (1, 100)]" in out, out
