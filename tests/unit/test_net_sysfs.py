"""sysfs/procfs parsing on the fake trees, and the trees themselves match their generator."""

from __future__ import annotations

import filecmp
import ipaddress
from pathlib import Path

from tests.conftest import REPO
from tests.data.sysfs.build import CASES, build
from torchhpc.network.sysfs import Gid, probe

TREES = REPO / "tests" / "data" / "sysfs"


def test_committed_trees_match_build_py(tmp_path: Path) -> None:
    build(tmp_path)
    for case in CASES:
        cmp = filecmp.dircmp(TREES / case, tmp_path / case)
        stack = [cmp]
        while stack:
            c = stack.pop()
            assert not (c.left_only or c.right_only or c.diff_files), (case, c.left, c.left_only, c.right_only, c.diff_files)
            stack.extend(c.subdirs.values())


def test_roce_port() -> None:
    inv = probe(TREES / "connectx-roce")
    (port,) = inv.ib_ports
    assert port.name == "mlx5_bond_0:1"
    assert port.active and port.roce
    assert port.rate.startswith("200 Gb/sec")
    assert [g.index for g in port.gids] == [0, 1, 2, 3, 4, 5]  # all-zero slots skipped
    g5 = port.gids[5]
    assert g5.roce_v2 and g5.ipv4 and g5.address == ipaddress.ip_address("10.1.0.5") and g5.ndev == "bond0"
    assert port.gids[0].link_local and not port.gids[0].roce_v2
    assert port.netdevs == ("bond0",)
    assert inv.gpu_kind == "nvidia" and inv.peermem


def test_down_port_and_interfaces() -> None:
    inv = probe(TREES / "connectx-roce-multi")
    states = {p.name: p.active for p in inv.ib_ports}
    assert states == {"mlx5_0:1": True, "mlx5_1:1": True, "mlx5_2:1": False}
    ens2 = inv.interface("ens2f0")
    assert ens2 is not None and not ens2.up


def test_interface_kinds() -> None:
    inv = probe(TREES / "connectx-roce-bond-vlan")
    kinds = {i.name: i.kind for i in inv.interfaces}
    assert kinds["lo"] == "loopback" and kinds["bond0"] == "bond" and kinds["bond0.100"] == "vlan"
    assert kinds["eth0"] == "ether"
    bond = inv.interface("bond0")
    assert bond is not None and bond.slaves == ("ens1f0np0", "ens1f1np1")
    slave = inv.interface("ens1f0np0")
    assert slave is not None and slave.master == "bond0"
    nf = probe(TREES / "no-fabric")
    assert {i.name: i.kind for i in nf.interfaces}["docker0"] == "bridge"
    docker = nf.interface("docker0")
    assert docker is not None and docker.container_or_virtual
    ib = probe(TREES / "connectx-ib").interface("ib0")
    assert ib is not None and ib.kind == "infiniband"


def test_routes_longest_prefix_and_local_addresses() -> None:
    inv = probe(TREES / "connectx-roce-bond-vlan")
    r = inv.route_to(ipaddress.ip_address("10.2.0.1"))
    assert r is not None and r.iface == "bond0.100" and str(r.network) == "10.2.0.0/24"
    default = inv.route_to(ipaddress.ip_address("8.8.8.8"))
    assert default is not None and default.iface == "eth0" and str(default.gateway) == "10.0.0.1"
    assert inv.local_iface(ipaddress.ip_address("10.2.0.5")) == "bond0.100"
    assert inv.local_iface(ipaddress.ip_address("127.0.0.1")) == "lo"
    assert inv.local_iface(ipaddress.ip_address("10.2.0.9")) is None


def test_ipv6_routes_and_addresses() -> None:
    inv = probe(TREES / "connectx-roce-ipv6")
    r = inv.route_to(ipaddress.ip_address("fd00:10:1::1"))
    assert r is not None and r.iface == "bond0"
    assert inv.local_iface(ipaddress.ip_address("fd00:10:1::5")) == "bond0"


def test_this_machines_real_proc_parses() -> None:
    inv = probe("/")
    assert inv.interface("lo") is not None
    assert inv.local_iface(ipaddress.ip_address("127.0.0.1")) == "lo"


def test_zero_and_garbage_gids() -> None:
    assert Gid(0, "0000:0000:0000:0000:0000:0000:0000:0000").address is None
    assert Gid(0, "not a gid").address is None
