"""The NCCL_DEBUG=INFO parser and its verdict, on logs in NCCL's printed format (tests/data/nccl/README.md)."""

from __future__ import annotations

import pytest

from tests.conftest import REPO
from torchhpc.cli.main import main
from torchhpc.errors import UsageError
from torchhpc.network.check import NcclReport, _report_line, parse_nccl_log, verdict

LOGS = REPO / "tests" / "data" / "nccl"


def log(name: str) -> str:
    return (LOGS / name).read_text()


def test_roce_log() -> None:
    rep = parse_nccl_log(log("ib_roce_2nodes.log"))
    assert rep.version == "2.19.3+cuda12.3"
    assert rep.network == "IB"
    assert rep.ib_devices == ["mlx5_bond_0:1/RoCE"]
    assert rep.oob_ifaces == ["bond0"]
    assert rep.transports == {"NET/IB": 4}
    assert rep.gdr is True
    assert rep.fabric == "ib"
    v = verdict(rep, "fabric")
    assert v.status == "pass" and "mlx5_bond_0:1/RoCE" in v.message


def test_socket_fallback_fails_when_the_fabric_was_expected() -> None:
    rep = parse_nccl_log(log("socket_fallback_2nodes.log"))
    assert rep.fabric == "socket"
    assert rep.socket_ifaces == ["eth0", "docker0"]
    assert rep.transports == {"NET/Socket": 4}
    assert any("NET/IB found no device" in w for w in rep.warnings)
    assert any("message truncated" in w for w in rep.warnings)
    v = verdict(rep, "fabric")
    assert v.status == "fail"
    assert "TCP sockets" in v.message and "eth0" in v.message
    assert v.hint and "NCCL_IB_HCA" in v.hint
    assert verdict(rep, "socket").status == "pass"
    assert verdict(rep, "any").status == "pass"


def test_single_node_has_no_network_traffic() -> None:
    rep = parse_nccl_log(log("single_node_p2p.log"))
    assert rep.transports == {"P2P": 3, "SHM": 1}
    assert len(rep.ib_devices) == 4
    # IB initialised, yet nothing crossed it: the fabric is judged by the channels.
    assert rep.fabric == "ib"  # network IB chosen for when traffic does leave the node
    assert verdict(rep, "fabric").status == "pass"


def test_rccl_with_the_ofi_plugin_counts_as_fabric() -> None:
    rep = parse_nccl_log(log("rccl_ofi_lumi.log"))
    assert rep.version == "2.18.3+hip6.0"
    assert rep.network == "AWS Libfabric"
    assert rep.ofi_provider == "cxi"
    assert rep.transports == {"NET/AWS Libfabric": 2}
    assert rep.fabric == "plugin"
    assert verdict(rep, "fabric").status == "pass"


def test_empty_log_warns() -> None:
    rep = parse_nccl_log("hello\nworld\n")
    assert rep.fabric is None
    assert verdict(rep).status == "warn"


def test_bad_expectation_is_a_usage_error() -> None:
    with pytest.raises(UsageError):
        verdict(NcclReport(), "ethernet")


def test_report_line_takes_the_last_json_line() -> None:
    out = 'noise\nTORCHHPC_CHECK {"rank": 1, "ok": true}\nTORCHHPC_CHECK not json\n'
    assert _report_line(out) == {"rank": 1, "ok": True}
    assert _report_line("nothing") == {}


def test_cli_check_log_fails_on_fallback(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["net", "check", "--expect", "fabric", "--log", str(LOGS / "socket_fallback_2nodes.log")])
    out = capsys.readouterr()
    assert rc == 1
    assert "FAIL: NCCL used TCP sockets" in out.out
    assert "HINT:" in out.err
    assert main(["net", "check", "--expect", "fabric", "--log", str(LOGS / "ib_roce_2nodes.log")]) == 0


def _fake_python(tmp_path: object, body: str) -> str:
    from pathlib import Path

    path = Path(str(tmp_path)) / "fake-python"
    path.write_text("#!/bin/bash\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


def test_run_local_passes_the_torchrun_contract(tmp_path: object) -> None:
    """Real processes, a stand-in interpreter: each rank echoes its environment as the report."""
    from torchhpc.network.check import run_local

    py = _fake_python(
        tmp_path,
        'printf \'TORCHHPC_CHECK {"ok": true, "rank": %s, "ws": %s, "lr": %s, "addr": "%s", "port": %s, '
        '"argv": "%s", "ifaces": ["lo"]}\\n\' "$RANK" "$WORLD_SIZE" "$LOCAL_RANK" "$MASTER_ADDR" "$MASTER_PORT" "$*"',
    )
    results = run_local(3, "gloo", "127.0.0.1", master_port=29999, python=py, env={"PATH": "/usr/bin:/bin"})
    assert [r.rank for r in results] == [0, 1, 2]
    for r in results:
        assert r.ok and r.ifaces == ["lo"]
        assert (r.report["rank"], r.report["ws"], r.report["lr"]) == (r.rank, 3, r.rank)
        assert (r.report["addr"], r.report["port"]) == ("127.0.0.1", 29999)
        assert r.report["argv"] == "-m torchhpc.network._check_worker"


def test_run_local_kills_hung_ranks(tmp_path: object) -> None:
    from torchhpc.errors import JobFailed
    from torchhpc.network.check import run_local

    py = _fake_python(tmp_path, "sleep 600")
    with pytest.raises(JobFailed) as e:
        run_local(2, "gloo", python=py, timeout=1.5, env={"PATH": "/usr/bin:/bin"})
    assert "did not finish" in e.value.message and "MASTER_ADDR" in (e.value.hint or "")


def test_run_local_needs_two_ranks() -> None:
    from torchhpc.network.check import run_local

    with pytest.raises(UsageError):
        run_local(1)
