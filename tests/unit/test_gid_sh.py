"""The pod-start RoCE GID detector (POSIX shell) gives the Python detector's answers.

The script runs for real under dash (Debian's /bin/sh, the strictest common
POSIX shell) and, for comparison, bash, over every fake sysfs tree in
tests/data/sysfs (fakes: no RDMA hardware here; see build.py for how they
follow the kernel's formats). TORCHHPC_SYSFS is the root prefix the script
reads under. The expected values come from ``torchhpc.network.select.detect``
on the same tree with the same master.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.conftest import missing
from tests.data.sysfs.build import CASES
from tests.unit.test_net_select import TREES
from torchhpc.network.gid_sh import GID_DETECT_SH, one_line
from torchhpc.network.select import detect
from torchhpc.network.sysfs import probe

NAMES = ("NCCL_IB_GID_INDEX", "NCCL_IB_HCA", "NCCL_SOCKET_FAMILY")
PRINT = "; ".join(f'echo "{n}=${{{n}-unset}}"' for n in NAMES)


def shell(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        missing(f"{name} is not installed (apt-get install -y {name})")
    return str(path)


def run_script(
    sh: str, case: str, master: str | None, preset: dict[str, str] | None = None, script: str = GID_DETECT_SH
) -> tuple[dict[str, str], str]:
    env = {"PATH": "/usr/bin:/bin", "TORCHHPC_SYSFS": str(TREES / case), **(preset or {})}
    if master is not None:
        env["MASTER_ADDR"] = master
    done = subprocess.run([sh, "-c", script + "\n" + PRINT], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    got = dict(line.split("=", 1) for line in done.stdout.splitlines())
    return {k: v for k, v in got.items() if v != "unset"}, done.stderr


FORMS = {"script": GID_DETECT_SH, "one-line": one_line()}  # the pod command carries the one-line form


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("sh", ["dash", "bash"])
def test_syntax(sh: str, form: str) -> None:
    done = subprocess.run([shell(sh), "-n", "-c", FORMS[form]], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert form == "script" or "\n" not in FORMS[form]


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("sh", ["dash", "bash"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_same_answer_as_python(sh: str, case: str, form: str) -> None:
    master = CASES[case]["master"]
    expected = {k: v for k, v in detect(probe(TREES / case), master).env.items() if k in NAMES}
    got, err = run_script(shell(sh), case, master, script=FORMS[form])
    assert got == expected, err
    if "NCCL_IB_HCA" in expected:
        assert err == ""
    else:  # nothing found: exactly one warning line
        assert len(err.splitlines()) == 1 and err.startswith("torchhpc: "), err


@pytest.mark.parametrize("master", ["10.1.0.1", "10.2.0.1"])
def test_route_to_master_picks_the_vlan_gid(master: str) -> None:
    """Two RoCE v2 IPv4 GIDs (bond0 and bond0.100): the master's route decides, as in Python."""
    expected = detect(probe(TREES / "connectx-roce-bond-vlan"), master).env["NCCL_IB_GID_INDEX"]
    got, _ = run_script(shell("dash"), "connectx-roce-bond-vlan", master)
    assert got["NCCL_IB_GID_INDEX"] == expected
    assert {"10.1.0.1": "3", "10.2.0.1": "5"}[master] == expected


def test_values_already_set_win() -> None:
    got, _ = run_script(shell("dash"), "connectx-roce", "10.1.0.1", {"NCCL_IB_HCA": "mlx5", "NCCL_IB_GID_INDEX": "7"})
    assert got["NCCL_IB_HCA"] == "mlx5" and got["NCCL_IB_GID_INDEX"] == "7"


def test_missing_root_warns_once() -> None:
    got, err = run_script(shell("dash"), "does-not-exist", None)
    assert got == {} and len(err.splitlines()) == 1
