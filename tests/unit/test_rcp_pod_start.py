"""The rcp profile sets NCCL_IB_GID_INDEX at pod start, from the pod's sysfs (seed 004's key step).

What runs is exactly what RunAI would hand the pod: the rendered ``bash -c
'"..."'`` argument parsed by a real bash (the pod's shell), then the payload
(the POSIX-shell GID detector, then a real torchrun, here with one pod).
Only sysfs is recorded: TORCHHPC_SYSFS points the detector at the fake
ConnectX trees under tests/data/sysfs (no RDMA hardware here), and RunAI's
per-pod variables (MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK) are set by hand.
The expected index is the seed's own one-liner run over the same tree.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.test_net_select import TREES, one_liner
from torchhpc.resolve import build_spec
from torchhpc.schedulers import get_scheduler


def render_rcp(program: list[str]) -> list[str]:
    spec = build_spec({"profile": "rcp", "nodes": 1, "image": "registry/img:1"}, program, {"HOME": "/nonexistent"})
    return list(get_scheduler("runai").render(spec).argv)


def test_rcp_renders_detection_before_torchrun() -> None:
    argv = render_rcp(["examples/pi.py"])
    payload = argv[-1]
    # Seed 004's image has no torchhpc: the pod command must not need it (issue 27).
    assert "python -m torchhpc" not in payload and "torchhpc net" not in payload
    assert "NCCL_IB_GID_INDEX" in payload
    assert payload.index("_th_gid_detect") < payload.index("torch.distributed.run")
    # The seed's other exports come from the roce preset, as RunAI -e variables.
    envs = [argv[i + 1] for i, a in enumerate(argv) if a == "-e"]
    assert "NCCL_IB_HCA=mlx5" in envs and "NCCL_SOCKET_NTHREADS=4" in envs and "NCCL_NSOCKS_PERTHREAD=8" in envs
    assert "--annotation" in argv and "rdma/rdma=1" in argv


@pytest.mark.parametrize("case", ["connectx-roce", "connectx-roce-ipv6"])
def test_pod_exports_gid_index_from_sysfs(case: str, tmp_path: Path) -> None:
    argv = render_rcp(["bash", "-c", 'echo "GID=${NCCL_IB_GID_INDEX:-unset} HCA=$NCCL_IB_HCA"'])
    # RunAI's -e NAME=VALUE flags become the pod's environment.
    pod_env = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "-e")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    shim = bindir / "python"  # the image's `python` (a symlink would lose the venv)
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    shim.chmod(0o755)
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "TORCHHPC_"))},
        **pod_env,
        "PATH": f"{bindir}:{os.environ['PATH']}",
        "PYTHONPATH": "",  # no torchhpc in the pod: the image needs nothing of ours
        "TORCHHPC_SYSFS": str(TREES / case),
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "1", "RANK": "0",
    }
    # The pod's shell parses the second quoting layer, as RunAI's `-- bash -c '"..."'` requires.
    done = subprocess.run(["bash", "-c", "bash -c " + argv[-1]], env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    m = re.search(r"GID=(\S+) HCA=(\S+)", done.stdout)
    assert m, done.stdout + done.stderr
    expected = one_liner(case).strip() or None
    if case == "connectx-roce":
        assert expected == "5"  # the seed's one-liner on the seed's situation
        assert m.group(1) == expected
    else:
        # IPv6 only: the seed's grep for ::ffff: finds nothing; detection picks the RoCE v2 IPv6 GID.
        assert expected is None and m.group(1) == "3"
    assert m.group(2) == "mlx5"  # the profile's NCCL_IB_HCA (seed 004) wins over detection: setdefault


def test_kubernetes_pod_detects_at_start_with_network_auto() -> None:
    """The Kubeflow PyTorchJob path gets the same start-up detection for --network auto (or roce,auto)."""
    spec = build_spec({"scheduler": "kubernetes", "nodes": 2, "image": "registry.example/img:1", "network": "roce,auto"},
                      ["examples/pi.py"], {"HOME": "/nonexistent"})
    text = str(get_scheduler("kubernetes").render(spec))
    assert "net detect --export" in text and text.index("net detect") < text.index("torch.distributed.run")
    plain = build_spec({"scheduler": "kubernetes", "nodes": 2, "image": "registry.example/img:1", "network": "roce"},
                       ["examples/pi.py"], {"HOME": "/nonexistent"})
    assert "net detect" not in str(get_scheduler("kubernetes").render(plain))


def test_one_node_is_the_master_pod_only() -> None:
    """Seed 004: pods = --workers + 1, so --nodes 1 is --workers 0, a PyTorchJob with its master pod only."""
    spec = build_spec({"profile": "rcp", "nodes": 1, "image": "registry/img:1"}, ["examples/pi.py"], {"HOME": "/nonexistent"})
    sub = get_scheduler("runai").render(spec)
    argv = list(sub.argv)
    assert argv[argv.index("--workers") + 1] == "0"
    assert any("master pod only" in n for n in sub.notes)


def test_time_is_refused_not_dropped() -> None:
    from torchhpc.errors import SpecError

    spec = build_spec({"profile": "rcp", "nodes": 2, "image": "registry/img:1"}, ["examples/pi.py"], {"HOME": "/nonexistent"})
    with pytest.raises(SpecError) as e:
        get_scheduler("runai").render(spec.with_(time="01:00:00"))
    assert "--time" in str(e.value)
