"""Write the fake sysfs/procfs trees under tests/data/sysfs/ (run: python tests/data/sysfs/build.py).

Each tree holds only the files torchhpc.network.sysfs reads, laid out and
formatted as the Linux kernel writes them (mlx5 ConnectX RoCE/InfiniBand GID
tables with ``gid_attrs/types`` and ``gid_attrs/ndevs``, unused GID slots
all-zero with no readable type, ``/proc/net/route`` little-endian hex,
``fib_trie`` LOCAL leaves, ``if_inet6``, ``ipv6_route``). They are modelled
on real machines, not copied from one: no RDMA hardware exists here.

Cases (the master address each test uses is in CASES[...]["master"]):

connectx-roce          one bonded ConnectX (mlx5_bond_0, as in seed 004): link-local,
                       global IPv6 and IPv4 GIDs in both RoCE versions; the answer is 5
connectx-roce-bond-vlan mlx5_bond_0 with two IPv4 addresses (bond0 and VLAN bond0.100):
                       two RoCE v2 IPv4 GIDs, the right one depends on the master's route
connectx-roce-multi    three single-port devices mlx5_0/1/2 (no bond), mlx5_2 DOWN
connectx-roce-ipv6     mlx5_bond_0 with IPv6 only
connectx-ib            four InfiniBand HDR ports with IPoIB ib0-3 and an Ethernet eth0
slingshot              LUMI-like: AMD GPUs, hsn0-3 Slingshot, nmn0 management network
no-fabric              eth0, docker0 bridge and a veth; no RDMA at all
"""

from __future__ import annotations

import ipaddress
import shutil
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
V1, V2 = "IB/RoCE v1", "RoCE v2"


def gid_of(addr: str) -> str:
    a = ipaddress.ip_address(addr)
    v6 = ipaddress.IPv6Address("::ffff:" + addr) if a.version == 4 else a
    h = f"{int(v6):032x}"
    return ":".join(h[i : i + 4] for i in range(0, 32, 4))


def roce_gids(ndev: str, mac_ll: str, addrs: list[str]) -> list[tuple[str, str, str]]:
    """The mlx5 pattern: each address gets a v1 then a v2 slot, link-local first."""
    out = [(gid_of(mac_ll), V1, ndev), (gid_of(mac_ll), V2, ndev)]
    for a in addrs:
        out += [(gid_of(a), V1, ndev), (gid_of(a), V2, ndev)]
    return out


CASES: dict[str, dict[str, Any]] = {
    "connectx-roce": {
        "master": "10.1.0.1",
        "ib": {
            "mlx5_bond_0": {
                "link_layer": "Ethernet",
                "rate": "200 Gb/sec (2X HDR)",
                "gids": roce_gids("bond0", "fe80::a288:c2ff:fe3b:506a", ["fd00:10:1::5", "10.1.0.5"]),
            }
        },
        "net": {
            "eth0": {"addrs": ["10.0.0.5/24"], "device": True},
            "bond0": {"addrs": ["10.1.0.5/24", "fd00:10:1::5/64"], "slaves": ["ens1f0np0", "ens1f1np1"]},
            "ens1f0np0": {"master": "bond0", "device": True},
            "ens1f1np1": {"master": "bond0", "device": True},
        },
        "default": ("eth0", "10.0.0.1"),
        "modules": ["nvidia", "nvidia_peermem"],
    },
    "connectx-roce-bond-vlan": {
        "master": "10.2.0.1",
        "ib": {
            "mlx5_bond_0": {
                "link_layer": "Ethernet",
                "rate": "100 Gb/sec (2X EDR)",
                "gids": [
                    *roce_gids("bond0", "fe80::a288:c2ff:fe3b:506b", ["10.1.0.5"]),
                    (gid_of("10.2.0.5"), V1, "bond0.100"),
                    (gid_of("10.2.0.5"), V2, "bond0.100"),
                ],
            }
        },
        "net": {
            "eth0": {"addrs": ["10.0.0.5/24"], "device": True},
            "bond0": {"addrs": ["10.1.0.5/24"], "slaves": ["ens1f0np0", "ens1f1np1"]},
            "bond0.100": {"addrs": ["10.2.0.5/24"]},
            "ens1f0np0": {"master": "bond0", "device": True},
            "ens1f1np1": {"master": "bond0", "device": True},
        },
        "default": ("eth0", "10.0.0.1"),
        "modules": ["nvidia", "nvidia_peermem"],
    },
    "connectx-roce-multi": {
        "master": "10.1.0.1",
        "ib": {
            "mlx5_0": {"link_layer": "Ethernet", "rate": "100 Gb/sec (4X EDR)",
                       "gids": roce_gids("ens1f0", "fe80::1:1", ["10.1.0.5"])},
            "mlx5_1": {"link_layer": "Ethernet", "rate": "100 Gb/sec (4X EDR)",
                       "gids": roce_gids("ens1f1", "fe80::1:2", ["10.1.1.5"])},
            "mlx5_2": {"link_layer": "Ethernet", "rate": "40 Gb/sec (4X QDR)", "state": "1: DOWN",
                       "phys_state": "3: Disabled", "gids": roce_gids("ens2f0", "fe80::1:3", [])},
        },
        "net": {
            "eth0": {"addrs": ["10.0.0.5/24"], "device": True},
            "ens1f0": {"addrs": ["10.1.0.5/24"], "device": True},
            "ens1f1": {"addrs": ["10.1.1.5/24"], "device": True},
            "ens2f0": {"operstate": "down", "device": True},
        },
        "default": ("eth0", "10.0.0.1"),
        "modules": ["nvidia"],
    },
    "connectx-roce-ipv6": {
        "master": "fd00:10:1::1",
        "ib": {
            "mlx5_bond_0": {"link_layer": "Ethernet", "rate": "200 Gb/sec (2X HDR)",
                            "gids": roce_gids("bond0", "fe80::a288:c2ff:fe3b:506c", ["fd00:10:1::5"])},
        },
        "net": {
            "eth0": {"addrs": ["10.0.0.5/24"], "device": True},
            "bond0": {"addrs": ["fd00:10:1::5/64"], "slaves": ["ens1f0np0"]},
            "ens1f0np0": {"master": "bond0", "device": True},
        },
        "default": ("eth0", "10.0.0.1"),
        "modules": ["nvidia", "nvidia_peermem"],
    },
    "connectx-ib": {
        "master": "10.10.0.1",
        "ib": {
            f"mlx5_{i}": {"link_layer": "InfiniBand", "rate": "200 Gb/sec (4X HDR)",
                          "gids": [(f"fe80:0000:0000:0000:0c42:a103:00{i:02x}:1234", V1, "")]}
            for i in range(4)
        },
        "net": {
            "eth0": {"addrs": ["10.0.0.5/24"], "device": True},
            **{f"ib{i}": {"addrs": [f"10.1{i}.0.5/16"], "type": "32", "device": True} for i in range(4)},
        },
        "default": ("eth0", "10.0.0.1"),
        "modules": ["nvidia"],
    },
    "slingshot": {
        "master": "10.252.1.1",
        "ib": {},
        "net": {
            "nmn0": {"addrs": ["10.100.0.5/16"], "device": True},
            **{f"hsn{i}": {"addrs": [f"10.25{2 + i}.1.5/16"], "device": True} for i in range(4)},
        },
        "default": ("nmn0", "10.100.0.1"),
        "modules": ["amdgpu"],
    },
    "no-fabric": {
        "master": "10.0.0.1",
        "ib": {},
        "net": {
            "eth0": {"addrs": ["10.0.0.5/24"], "device": True},
            "docker0": {"addrs": ["172.17.0.1/16"], "bridge": True},
            "veth1a2b3c": {"master": "docker0"},
        },
        "default": ("eth0", "10.0.0.1"),
        "modules": [],
    },
}


def _w(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def _le(addr: ipaddress.IPv4Address) -> str:
    return f"{int.from_bytes(addr.packed, 'little'):08X}"


def build_case(root: Path, case: dict[str, Any]) -> None:
    for dev, d in case["ib"].items():
        port = root / "sys/class/infiniband" / dev / "ports/1"
        _w(port / "state", d.get("state", "4: ACTIVE"))
        _w(port / "phys_state", d.get("phys_state", "5: LinkUp"))
        _w(port / "link_layer", d["link_layer"])
        _w(port / "rate", d["rate"])
        gids = list(d["gids"])
        for i in range(max(16, len(gids))):
            if i < len(gids):
                gid, typ, ndev = gids[i]
                _w(port / "gids" / str(i), gid)
                _w(port / "gid_attrs/types" / str(i), typ)  # unused slots: EINVAL, i.e. no file here
                if ndev:
                    _w(port / "gid_attrs/ndevs" / str(i), ndev)
            else:
                _w(port / "gids" / str(i), "0000:0000:0000:0000:0000:0000:0000:0000")
    ifaces = {"lo": {"addrs": ["127.0.0.1/8", "::1/128"], "type": "772", "operstate": "unknown"}, **case["net"]}
    routes4: list[str] = []
    fib: list[str] = []
    inet6: list[str] = []
    routes6: list[str] = []
    for idx, (name, d) in enumerate(ifaces.items(), start=1):
        nd = root / "sys/class/net" / name
        _w(nd / "operstate", d.get("operstate", "up"))
        _w(nd / "type", d.get("type", "1"))
        _w(nd / "mtu", "65536" if name == "lo" else "9000")
        if d.get("device"):
            _w(nd / "device/vendor", "0x15b3")
        if d.get("slaves"):
            _w(nd / "bonding/slaves", " ".join(d["slaves"]))
        if d.get("bridge"):
            _w(nd / "bridge/bridge_id", "8000.0242ac110001")
        if d.get("master"):
            _w(nd / "master", d["master"])  # a symlink on real sysfs; the reader takes either
        for cidr in d.get("addrs", []):
            ifc = ipaddress.ip_interface(cidr)
            if ifc.version == 4:
                fib.append(f"     |-- {ifc.ip}\n        /32 host LOCAL")
                if name != "lo":
                    net = ifc.network
                    routes4.append(f"{name}\t{_le(net.network_address)}\t00000000\t0001\t0\t0\t0\t{_le(net.netmask)}\t0\t0\t0")
            else:
                inet6.append(f"{int(ifc.ip):032x} {idx:02x} {ifc.network.prefixlen:02x} 00 80 {name:>8}")
                if name != "lo":
                    routes6.append(
                        f"{int(ifc.network.network_address):032x} {ifc.network.prefixlen:02x} {0:032x} 00 {0:032x} "
                        f"00000100 00000001 00000000 00000001 {name:>8}"
                    )
                routes6.append(f"{int(ifc.ip):032x} 80 {0:032x} 00 {0:032x} 00000000 00000002 00000000 80200001 {name:>8}")
    gw_if, gw = case["default"]
    routes4.insert(0, f"{gw_if}\t00000000\t{_le(ipaddress.IPv4Address(gw))}\t0003\t0\t0\t0\t00000000\t0\t0\t0")
    header = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT"
    _w(root / "proc/net/route", "\n".join([header, *routes4]))
    _w(root / "proc/net/fib_trie", "Main:\n  +-- 0.0.0.0/0 3 0 5\n" + "\n".join(fib))
    _w(root / "proc/net/if_inet6", "\n".join(inet6))
    _w(root / "proc/net/ipv6_route", "\n".join(routes6))
    for m in case["modules"]:
        _w(root / "sys/module" / m / "refcnt", "0")


def build(dest: Path = HERE) -> list[Path]:
    out = []
    for name, case in CASES.items():
        root = dest / name
        if root.exists():
            shutil.rmtree(root)
        build_case(root, case)
        out.append(root)
    return out


if __name__ == "__main__":
    for p in build(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE):
        print(p)
