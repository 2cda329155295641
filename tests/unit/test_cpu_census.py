"""scripts/cpu_census.py: its shim logs real processes, and its tables read dump-acct's real format."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, load_file

census = load_file(REPO / "scripts" / "cpu_census.py")

# dump-acct's lines as acct 6.6.4 (Debian bookworm) printed them for run H's processes (docs/testing.md):
# command, version, user and system CPU in 1/100 s, elapsed, uid, gid, memory, io, pid, ppid, flags, exit, tty, start
DUMP = """\
python          |v3|   161.00|    19.00|   920.00|     0|     0|  2476.00|     0.00|   22516|   22505|     |       0|__      |Mon Nov 30 03:23:22 2026
pt_elastic      |v3|   190.00|    30.00|  1200.00|     0|     0|  2476.00|     0.00|   22517|   22505|     |       0|__      |Mon Nov 30 03:23:23 2026
python          |v3|     2.00|     1.00|    10.00|     0|     0|  2476.00|     0.00|   22518|   22505|     |       0|__      |Mon Nov 30 03:23:24 2026
bash            |v3|     0.00|     1.00|    24.00|     0|     0|  4488.00|  3232.00|   22505|   22504| F   |       0|__      |Mon Nov 30 03:23:22 2026
"""


def test_acct_table_sums_cpu_per_command_from_ticks() -> None:
    rows = census.acct_table(DUMP + "garbage line\n")
    assert rows[0] == ("pt_elastic", 1, pytest.approx(2.2))
    assert rows[1] == ("python", 2, pytest.approx(1.83))
    assert rows[2] == ("bash", 1, pytest.approx(0.01))


@pytest.mark.parametrize(
    ("argv", "name"),
    [
        (["/v/lib/python3.11/site-packages/torch/distributed/run.py", "--nnodes", "2"], "torchrun (agent)"),
        (["/v/bin/torchrun", "--standalone"], "torchrun (agent)"),
        (["/r/src/torchhpc/__main__.py", "status", "slurm:3"], "torchhpc status"),
        (["/r/examples/pi.py"], "pi.py"),
        (["-c"], "python -c"),
        ([], "?"),
    ],
)
def test_program_names_what_a_reader_would(argv: list[str], name: str) -> None:
    assert census.program(argv) == name


def test_shim_logs_a_real_process_and_the_report_counts_it(tmp_path: Path) -> None:
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    out = tmp_path / "procs.jsonl"
    census.install(tmp_path / "venv", out)
    env = {**os.environ, "PYTHONPATH": str(site), "PYTEST_CURRENT_TEST": "tests/x.py::t (call)"}
    subprocess.run([sys.executable, "-c", "import json; sum(i * i for i in range(10**6))"], env=env, check=True)
    (line,) = [json.loads(x) for x in out.read_text().splitlines()]
    assert line["argv"] == ["-c"] and line["cpu"] > 0 and line["heavy"] == [] and line["test"] == "tests/x.py::t"
    assert census.procs_table([line, {**line, "heavy": ["torch"], "cpu": 2.0}]) == [
        ("python -c", 2, 1, pytest.approx(line["cpu"] + 2.0))
    ]
    census.uninstall(tmp_path / "venv")
    assert not (site / "sitecustomize.py").exists()


def test_install_refuses_to_replace_someone_elses_sitecustomize(tmp_path: Path) -> None:
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (site / "sitecustomize.py").write_text("print('mine')\n")
    with pytest.raises(SystemExit, match="not the census shim"):
        census.install(tmp_path / "venv", tmp_path / "procs.jsonl")
    assert (site / "sitecustomize.py").read_text() == "print('mine')\n"
