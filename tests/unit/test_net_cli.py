"""`torchhpc net detect/presets` through the CLI entry point; --export output run by a real bash."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO
from torchhpc.cli.main import main

TREES = REPO / "tests" / "data" / "sysfs"


def test_detect_table_shows_reasons(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["net", "detect", "--sysfs", str(TREES / "connectx-roce"), "--master", "10.1.0.1"]) == 0
    out = capsys.readouterr().out
    assert "NCCL_IB_GID_INDEX   5" in out
    assert "RoCE v2 IPv4 10.1.0.5 on bond0" in out


def test_detect_json(capsys: pytest.CaptureFixture[str]) -> None:
    main(["net", "detect", "--sysfs", str(TREES / "slingshot"), "--master", "10.252.1.1", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert data["env"]["NCCL_SOCKET_IFNAME"] == "hsn0,hsn1,hsn2,hsn3"
    assert data["gpu_kind"] == "amd"
    assert all(c["reason"] for c in data["choices"])


def test_export_evaluates_with_setdefault_semantics() -> None:
    cmd = [sys.executable, "-m", "torchhpc", "net", "detect", "--export",
           "--sysfs", str(TREES / "connectx-roce-bond-vlan"), "--master", "10.2.0.1"]
    script = (
        'eval "$("$@")"\n'
        'printf "%s|%s|%s" "$NCCL_IB_GID_INDEX" "$NCCL_SOCKET_IFNAME" "$NCCL_IB_HCA"'
    )
    env = {"PATH": "/usr/bin:/bin", "NCCL_SOCKET_IFNAME": "mine0"}
    out = subprocess.run(["bash", "-euc", script, "bash", *cmd], capture_output=True, text=True,
                         env=env, check=True, timeout=60).stdout
    assert out == "5|mine0|mlx5_bond_0:1"


def test_bad_sysfs_root_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["net", "detect", "--sysfs", "/nonexistent/root"]) == 2
    assert "--sysfs" in capsys.readouterr().err


def test_presets_show_and_unknown(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["net", "presets", "lumi-slingshot"]) == 0
    assert "hsn0,hsn1,hsn2,hsn3" in capsys.readouterr().out
    assert main(["net", "presets", "roce", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["NCCL_IB_HCA"] == "mlx5"
    assert main(["net", "presets", "infiniband-ish"]) == 2
    assert "choose from: auto, tcp" in capsys.readouterr().err
