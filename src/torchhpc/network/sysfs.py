"""Read the machine's network facts from sysfs and procfs, under an injectable root.

Everything here is a pure function of files: ``/sys/class/infiniband`` (RDMA
ports, their state, link layer, rate, GID table and GID types),
``/sys/class/net`` (interfaces, bonds, bridges), ``/sys/module`` (which GPU
driver, whether GPUDirect RDMA's ``nvidia_peermem`` is loaded) and
``/proc/net/{route,ipv6_route,fib_trie,if_inet6}`` (routes and local
addresses). ``/proc/net`` is per network namespace, so reading it inside a
container or ``nsenter --net`` shows that namespace's routes, which is what
interface selection needs. Tests point ``root`` at a fake tree
(tests/data/sysfs/*); nothing here runs a command.

Missing or unreadable files are normal (unused GID slots return EINVAL, old
kernels lack ``gid_attrs``): they read as ``None`` and never raise.
"""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

__all__ = [
    "Gid",
    "IBPort",
    "Inventory",
    "NetIf",
    "Route",
    "probe",
]

ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
IPAddr = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]


def _read(path: Path) -> Optional[str]:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:  # missing, EINVAL on unused GID slots, permission
        return None


def _ls(path: Path) -> list[str]:
    try:
        return sorted(os.listdir(path), key=_natural)
    except OSError:
        return []


def _natural(name: str) -> tuple[object, ...]:
    """``mlx5_2`` before ``mlx5_10``; GID ``9`` before ``10``."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


@dataclass(frozen=True)
class Gid:
    """One slot of a port's GID table (``ports/N/gids/I``)."""

    index: int
    gid: str
    type: Optional[str] = None  # "RoCE v2", "IB/RoCE v1"; None when unreadable
    ndev: Optional[str] = None  # the netdev the GID belongs to (bond0, eth2.100)

    @property
    def address(self) -> Optional[IPAddr]:
        """The IP address a RoCE GID carries (IPv4-mapped GIDs give the IPv4 address)."""
        if self.gid == ZERO_GID:
            return None
        try:
            addr = ipaddress.IPv6Address(self.gid)
        except ValueError:
            return None
        return addr.ipv4_mapped or addr

    @property
    def ipv4(self) -> bool:
        return isinstance(self.address, ipaddress.IPv4Address)

    @property
    def link_local(self) -> bool:
        addr = self.address
        return isinstance(addr, ipaddress.IPv6Address) and addr.is_link_local

    @property
    def roce_v2(self) -> bool:
        return (self.type or "").strip().lower() == "roce v2"


@dataclass(frozen=True)
class IBPort:
    """One port of an RDMA device (``/sys/class/infiniband/DEV/ports/N``)."""

    device: str
    port: int
    state: str = ""  # "ACTIVE", "DOWN", ... (the text after "4: ")
    phys_state: str = ""  # "LinkUp", "Disabled", ...
    link_layer: str = ""  # "InfiniBand" or "Ethernet" (RoCE)
    rate: str = ""
    gids: tuple[Gid, ...] = ()

    @property
    def name(self) -> str:
        return f"{self.device}:{self.port}"

    @property
    def active(self) -> bool:
        return self.state.upper() == "ACTIVE" and self.phys_state.lower() in ("", "linkup")

    @property
    def roce(self) -> bool:
        return self.link_layer.lower() == "ethernet"

    @property
    def netdevs(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(g.ndev for g in self.gids if g.ndev))


@dataclass(frozen=True)
class NetIf:
    """One network interface (``/sys/class/net/NAME``)."""

    name: str
    operstate: str = "unknown"
    kind: str = "ether"  # loopback, ether, infiniband, bond, bridge, vlan, virtual
    mtu: Optional[int] = None
    slaves: tuple[str, ...] = ()  # bond members
    master: Optional[str] = None  # the bond/bridge this one belongs to

    @property
    def up(self) -> bool:
        # "unknown" is what loopback, tun and many virtual devices report while working.
        return self.operstate in ("up", "unknown")

    @property
    def container_or_virtual(self) -> bool:
        """Interfaces that never carry traffic between nodes."""
        return self.kind == "loopback" or self.name.startswith(("docker", "virbr", "veth", "cni", "flannel", "podman"))


@dataclass(frozen=True)
class Route:
    """One row of the main routing table."""

    iface: str
    network: Union[ipaddress.IPv4Network, ipaddress.IPv6Network]
    gateway: Optional[IPAddr] = None
    metric: int = 0

    def __str__(self) -> str:
        via = f" via {self.gateway}" if self.gateway else ""
        return f"{self.network}{via} dev {self.iface}"


@dataclass(frozen=True)
class Inventory:
    """What :func:`probe` found; the input of :mod:`torchhpc.network.select`."""

    root: str
    ib_ports: tuple[IBPort, ...] = ()
    interfaces: tuple[NetIf, ...] = ()
    routes: tuple[Route, ...] = ()
    local_addresses: tuple[tuple[str, str], ...] = ()  # (address, iface or "")
    gpu_kind: Optional[str] = None  # "nvidia", "amd" or None (no GPU driver loaded)
    peermem: bool = False  # nvidia_peermem (GPUDirect RDMA) loaded
    notes: tuple[str, ...] = field(default=())

    def interface(self, name: str) -> Optional[NetIf]:
        return next((i for i in self.interfaces if i.name == name), None)

    def route_to(self, addr: IPAddr) -> Optional[Route]:
        """Longest-prefix match in the main table (as ``ip route get`` would, minus policy rules)."""
        best: Optional[Route] = None
        for r in self.routes:
            if r.network.version != addr.version or addr not in r.network:
                continue
            if (
                best is None
                or r.network.prefixlen > best.network.prefixlen
                or (r.network.prefixlen == best.network.prefixlen and r.metric < best.metric)
            ):
                best = r
        return best

    def local_iface(self, addr: IPAddr) -> Optional[str]:
        """The interface holding ``addr`` if it is one of this machine's addresses ("" if unknown)."""
        if addr.is_loopback:
            return "lo"
        for a, iface in self.local_addresses:
            if ipaddress.ip_address(a) == addr:
                if iface:
                    return iface
                r = self.route_to(addr)
                return r.iface if r else ""
        return None


# --------------------------------------------------------------------------- probes


def probe(root: str | os.PathLike[str] = "/") -> Inventory:
    """Read everything under ``root`` (``/`` on a real machine)."""
    base = Path(root)
    notes: list[str] = []
    ports = tuple(_ib_ports(base))
    ifaces = tuple(_interfaces(base))
    routes = tuple(_routes4(base)) + tuple(_routes6(base))
    if not (base / "proc/net/route").exists():
        notes.append(f"{base / 'proc/net/route'} is missing: cannot tell which interface reaches the master")
    local = tuple(_local4(base)) + tuple(_local6(base))
    modules = base / "sys/module"
    gpu_kind = "nvidia" if (modules / "nvidia").exists() else "amd" if (modules / "amdgpu").exists() else None
    return Inventory(
        root=str(base),
        ib_ports=ports,
        interfaces=ifaces,
        routes=routes,
        local_addresses=local,
        gpu_kind=gpu_kind,
        peermem=(modules / "nvidia_peermem").exists() or (modules / "nv_peer_mem").exists(),
        notes=tuple(notes),
    )


def _ib_ports(base: Path) -> list[IBPort]:
    out: list[IBPort] = []
    ib = base / "sys/class/infiniband"
    for dev in _ls(ib):
        for p in _ls(ib / dev / "ports"):
            if not p.isdigit():
                continue
            pdir = ib / dev / "ports" / p
            gids = []
            for g in _ls(pdir / "gids"):
                if not g.isdigit():
                    continue
                value = _read(pdir / "gids" / g)
                if not value or value == ZERO_GID:
                    continue
                gids.append(
                    Gid(
                        index=int(g),
                        gid=value.lower(),
                        type=_read(pdir / "gid_attrs/types" / g),
                        ndev=_read(pdir / "gid_attrs/ndevs" / g),
                    )
                )
            out.append(
                IBPort(
                    device=dev,
                    port=int(p),
                    state=_after_colon(_read(pdir / "state")),
                    phys_state=_after_colon(_read(pdir / "phys_state")),
                    link_layer=_read(pdir / "link_layer") or "",
                    rate=_read(pdir / "rate") or "",
                    gids=tuple(gids),
                )
            )
    return out


def _after_colon(text: Optional[str]) -> str:
    """``"4: ACTIVE"`` -> ``"ACTIVE"``."""
    return (text or "").split(":", 1)[-1].strip()


_ARPHRD = {"1": "ether", "32": "infiniband", "772": "loopback", "776": "virtual", "65534": "virtual"}


def _interfaces(base: Path) -> list[NetIf]:
    net = base / "sys/class/net"
    out: list[NetIf] = []
    for name in _ls(net):
        d = net / name
        if not d.is_dir():
            continue
        kind = _ARPHRD.get(_read(d / "type") or "1", "ether")
        if (d / "bonding").is_dir():
            kind = "bond"
        elif (d / "bridge").is_dir():
            kind = "bridge"
        elif kind == "ether" and "." in name:
            kind = "vlan"
        elif kind == "ether" and not (d / "device").exists() and name != "lo":
            kind = "virtual"
        slaves = tuple((_read(d / "bonding/slaves") or "").split())
        master = None
        master_link = d / "master"
        if master_link.exists():
            master = os.path.basename(os.path.realpath(master_link)) if master_link.is_symlink() else _read(master_link)
        mtu = _read(d / "mtu")
        out.append(
            NetIf(
                name=name,
                operstate=(_read(d / "operstate") or "unknown").lower(),
                kind=kind,
                mtu=int(mtu) if mtu and mtu.isdigit() else None,
                slaves=slaves,
                master=master,
            )
        )
    return out


def _routes4(base: Path) -> list[Route]:
    """``/proc/net/route``: little-endian hex addresses, RTF_UP=0x1, RTF_REJECT=0x200."""
    text = _read(base / "proc/net/route")
    out: list[Route] = []
    for line in (text or "").splitlines()[1:]:
        f = line.split()
        if len(f) < 8:
            continue
        try:
            dest, gw, flags, metric, mask = (int(f[1], 16), int(f[2], 16), int(f[3], 16), int(f[6]), int(f[7], 16))
        except ValueError:
            continue
        if not flags & 0x1 or flags & 0x200:
            continue
        d, m, g = (ipaddress.IPv4Address(_swap32(x)) for x in (dest, mask, gw))
        try:
            net = ipaddress.IPv4Network(f"{d}/{m}", strict=False)
        except ValueError:
            continue
        out.append(Route(f[0], net, g if int(g) else None, metric))
    return out


def _swap32(x: int) -> int:
    return int.from_bytes(x.to_bytes(4, "little"), "big")


def _routes6(base: Path) -> list[Route]:
    """``/proc/net/ipv6_route``; local/multicast entries and reject routes are skipped."""
    text = _read(base / "proc/net/ipv6_route")
    out: list[Route] = []
    for line in (text or "").splitlines():
        f = line.split()
        if len(f) < 10:
            continue
        try:
            dest = ipaddress.IPv6Address(int(f[0], 16))
            plen, gw, metric, flags = int(f[1], 16), ipaddress.IPv6Address(int(f[4], 16)), int(f[5], 16), int(f[8], 16)
        except ValueError:
            continue
        if not flags & 0x1 or flags & 0x200 or flags & 0x80000000 or dest.is_multicast:
            continue
        out.append(Route(f[9], ipaddress.IPv6Network(f"{dest}/{plen}", strict=False), gw if int(gw) else None, metric))
    return out


def _local4(base: Path) -> list[tuple[str, str]]:
    """This machine's IPv4 addresses: ``/32 host LOCAL`` leaves of ``/proc/net/fib_trie``."""
    text = _read(base / "proc/net/fib_trie") or ""
    out: list[str] = []
    last: Optional[str] = None
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("|--"):
            last = s[3:].strip()
        elif s.startswith("/32 host LOCAL") and last and last not in out:
            out.append(last)
    return [(a, "") for a in out]


def _local6(base: Path) -> list[tuple[str, str]]:
    text = _read(base / "proc/net/if_inet6") or ""
    out: list[tuple[str, str]] = []
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 6:
            try:
                out.append((str(ipaddress.IPv6Address(int(f[0], 16))), f[5]))
            except ValueError:
                continue
    return out
