"""Choose NCCL/RCCL/gloo settings from an :class:`~torchhpc.network.sysfs.Inventory`, with reasons.

Every decision is a :class:`Choice` (name, value or ``None`` for "leave
unset", reason), so ``torchhpc net detect`` can print why, and a wrong guess
is visible instead of silent. The rules:

* ``NCCL_IB_HCA``: the active RDMA ports only (``dev:port``); a down port in
  the list makes NCCL try it and stall or fall back to sockets. Exact-match
  (``=``) only when one name is a prefix of another (``mlx5_1`` vs ``mlx5_10``).
* ``NCCL_IB_GID_INDEX`` (RoCE only; InfiniBand addresses by LID): the
  ``RoCE v2`` GID that carries an IPv4-mapped address, per port; if a port has
  several (a bond with VLANs, a pod with secondary IPs) the one on the netdev
  that routes to the master; IPv6-only ports take their global (not
  link-local) RoCE v2 GID. The index is one value for every HCA, so ports
  that disagree are dropped from ``NCCL_IB_HCA`` with the reason. This is
  the RunAI on RCP guide's one-liner made robust: it hardcodes ``mlx5_bond_0``, prints two
  lines when there are two IPv4 GIDs, prints the word ``RoCE v2`` when only
  one GID file matches, and reads stdin when none does.
* ``NCCL_SOCKET_IFNAME`` / ``GLOO_SOCKET_IFNAME``: the interface whose route
  reaches the master; never ``lo``/``docker0``/``veth*`` unless the master
  is this machine (single node). Slingshot (``hsn*``) keeps all its rails for
  NCCL/RCCL (the LUMI guide) and the routing one for gloo (gloo wants exact names).
* ``NCCL_NET_GDR_LEVEL=3`` for AMD GPUs on Slingshot (the LUMI guide; RCCL's
  default from ROCm 6.2). On NVIDIA it is left to NCCL, with a warning when
  RDMA ports exist but ``nvidia_peermem`` is not loaded.

RCCL reads the same ``NCCL_*`` names, so AMD nodes get the same variables.
"""

from __future__ import annotations

import ipaddress
import socket
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Optional

from torchhpc.network.sysfs import Gid, IBPort, Inventory, IPAddr, NetIf

__all__ = ["Choice", "Detection", "detect", "pick_gid", "resolve_master"]

Resolver = Callable[[str], Sequence[IPAddr]]
_IFNAMES = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")


@dataclass(frozen=True)
class Choice:
    """One proposed variable. ``value is None`` means: leave it unset, for ``reason``."""

    name: str
    value: Optional[str]
    reason: str


@dataclass
class Detection:
    """All choices plus warnings; ``env`` holds only the variables to set."""

    choices: list[Choice] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    master: Optional[str] = None
    master_addr: Optional[str] = None
    gpu_kind: Optional[str] = None

    @property
    def env(self) -> dict[str, str]:
        return {c.name: c.value for c in self.choices if c.value is not None}

    def get(self, name: str) -> Optional[str]:
        return self.env.get(name)

    def to_dict(self) -> dict[str, object]:
        return {
            "master": self.master,
            "master_addr": self.master_addr,
            "gpu_kind": self.gpu_kind,
            "env": self.env,
            "choices": [asdict(c) for c in self.choices],
            "warnings": list(self.warnings),
        }


def resolve_master(host: str) -> list[IPAddr]:
    """IPv4 first (TCPStore and NCCL bootstrap prefer it), then IPv6."""
    try:
        return [ipaddress.ip_address(host.split("%")[0])]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):  # UnicodeError: a name IDNA cannot encode (empty or 64+ character label)
        return []
    addrs = dict.fromkeys(
        ipaddress.ip_address(str(sockaddr[0]).split("%")[0])
        for family, *_rest, sockaddr in infos
        if family in (socket.AF_INET, socket.AF_INET6)
    )
    return sorted(addrs, key=lambda a: a.version)


def detect(
    inv: Inventory, master: str | None = None, resolve: Resolver = resolve_master, nodes: int | None = None
) -> Detection:
    """Propose the variables for this node, talking to ``master`` (a host name or address).

    ``nodes`` (the job's node count, if known) decides what a master that
    resolves to loopback means: one node may use ``lo``, several may not.
    """
    det = Detection(master=master, gpu_kind=inv.gpu_kind)
    det.warnings.extend(inv.notes)
    route_if, single_node = _socket_iface(inv, master, resolve, det, nodes)
    _hca_and_gid(inv, route_if, det)
    _gdr(inv, det)
    if inv.gpu_kind == "amd":
        det.warnings.append("AMD GPUs: RCCL reads the same NCCL_* variables, so these apply to RCCL too")
    if single_node and not inv.ib_ports:
        det.warnings.append("single node: NCCL uses shared memory/P2P between local GPUs; the network choices matter little")
    return det


# ---------------------------------------------------------------- socket interface


def _socket_iface(
    inv: Inventory, master: str | None, resolve: Resolver, det: Detection, nodes: int | None = None
) -> tuple[Optional[str], bool]:
    """Add NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME; return (interface routing to master, single_node)."""
    hsn = [i.name for i in inv.interfaces if i.name.startswith("hsn") and i.up]
    if master:
        addrs = resolve(master)
        if not addrs:
            det.warnings.append(f"--master {master!r} does not resolve here")
            det.choices += [Choice(n, None, f"master {master!r} does not resolve; cannot tell which route reaches it") for n in _IFNAMES]
            return None, False
        addr = addrs[0]
        det.master_addr = str(addr)
        shown = master if master == str(addr) else f"{master} ({addr})"
        if addr.is_loopback:
            literal = master.split("%")[0] == str(addr)
            if literal or nodes == 1:
                if nodes is not None and nodes > 1:
                    det.warnings.append(f"master {shown} is loopback but the job has {nodes} nodes: they cannot reach it")
                why = f"master {shown} is loopback: single node, lo is fine"
                det.choices += [Choice(n, "lo", why) for n in _IFNAMES]
                return "lo", True
            # A host name that resolves to loopback here only (Debian's "127.0.1.1 <hostname>" line):
            # the other nodes resolve it to a real address, so never bind lo.
            det.warnings.append(
                f"master {shown} resolves to loopback on this node; other nodes resolve it elsewhere. "
                "Set MASTER_ADDR to an IP address (getent ahostsv4 HOST)"
            )
            return _guess(inv, hsn, det, f"master {shown} is loopback here, so not a route")
        local = inv.local_iface(addr)
        if local is not None:
            iface = local or "lo"
            why = f"master {shown} is this node's address on {iface}: the other nodes reach it there"
            _set_ifnames(inv, iface, hsn, why, det)
            return iface, False
        route = inv.route_to(addr)
        if route is None:
            det.warnings.append(f"no route to master {shown} in {inv.root.rstrip('/')}/proc/net/route")
            det.choices += [Choice(n, None, f"no route reaches master {addr}") for n in _IFNAMES]
            return None, False
        nif = inv.interface(route.iface)
        if nif is not None and nif.container_or_virtual:
            det.warnings.append(
                f"the route to master {addr} ({route}) uses {route.iface}, a virtual interface: "
                "other nodes cannot reach this one through it"
            )
        why = f"route {route} reaches master {shown}"
        _set_ifnames(inv, route.iface, hsn, why, det)
        return route.iface, False
    return _guess(inv, hsn, det, "no --master given; pass --master to check the route that matters")


def _guess(inv: Inventory, hsn: list[str], det: Detection, why: str) -> tuple[Optional[str], bool]:
    """Without a usable master: the fabric (Slingshot), then the default route's interface."""
    if hsn:
        _set_ifnames(inv, hsn[0], hsn, f"Slingshot interfaces hsn* are up ({why})", det)
        return hsn[0], False
    default = next((r for r in inv.routes if r.network.prefixlen == 0 and r.network.version == 4), None)
    if default is not None:
        _set_ifnames(inv, default.iface, [], f"default route {default} ({why})", det)
        return default.iface, False
    candidates = [i.name for i in inv.interfaces if i.up and not i.container_or_virtual and i.master is None]
    if candidates:
        _set_ifnames(inv, candidates[0], [], f"first interface that is up and not loopback/virtual ({why})", det)
        return candidates[0], False
    det.choices += [Choice(n, None, "no interface besides loopback/virtual ones is up") for n in _IFNAMES]
    return None, True


def _set_ifnames(inv: Inventory, iface: str, hsn: list[str], why: str, det: Detection) -> None:
    if iface.startswith("hsn") and len(hsn) > 1:
        det.choices.append(Choice("NCCL_SOCKET_IFNAME", ",".join(hsn), f"{why}; all Slingshot rails up ({len(hsn)})"))
        det.choices.append(Choice("GLOO_SOCKET_IFNAME", iface, f"{why}; gloo wants exact names, so the routing one"))
        return
    others = [i.name for i in inv.interfaces if i.name != iface and i.name.startswith(iface)]
    nccl = "=" + iface if others else iface
    extra = f" ('=' for an exact match: {', '.join(others)} share the prefix)" if others else ""
    det.choices.append(Choice("NCCL_SOCKET_IFNAME", nccl, why + extra))
    det.choices.append(Choice("GLOO_SOCKET_IFNAME", iface, why))


# ---------------------------------------------------------------- HCA and GID


def pick_gid(
    port: IBPort, prefer: Sequence[str] = (), master: IPAddr | None = None
) -> tuple[Optional[Gid], str]:
    """The RoCE v2 GID NCCL should use on ``port``, and why (``None`` when there is none).

    ``prefer`` lists netdevs best first (the interface routing to the master,
    then its bond/VLAN relatives); ``master`` breaks remaining ties by subnet.
    """
    v2 = [g for g in port.gids if g.roce_v2]
    if not v2:
        if port.gids and all(g.type is None for g in port.gids):
            return None, f"{port.name}: GID types unreadable (no gid_attrs/types)"
        return None, f"{port.name}: no RoCE v2 GID"
    v4 = [g for g in v2 if g.ipv4]
    pool, family = (v4, "IPv4") if v4 else ([g for g in v2 if not g.link_local], "global IPv6")
    if not pool:
        pool, family = v2, "link-local IPv6 (works within one L2 segment only)"
    if len(pool) > 1:
        for ndev in prefer:
            on_dev = [g for g in pool if g.ndev == ndev]
            if on_dev:
                g = on_dev[0]
                rel = "routing to the master" if ndev == prefer[0] else f"related to {prefer[0]}, which routes to the master"
                return g, f"{port.name}: GID {g.index} is RoCE v2 {family} {g.address} on {g.ndev}, the interface {rel}"
        if master is not None:
            same = [g for g in pool if g.address is not None and _same_subnet(g.address, master)]
            if same:
                g = same[0]
                return g, f"{port.name}: GID {g.index} is RoCE v2 {family} {g.address}, in the master's /24"
        g = pool[0]
        others = ", ".join(str(x.index) for x in pool[1:])
        return g, f"{port.name}: GID {g.index} is the first of several RoCE v2 {family} GIDs (also {others})"
    g = pool[0]
    on = f" on {g.ndev}" if g.ndev else ""
    return g, f"{port.name}: GID {g.index} is RoCE v2 {family} {g.address}{on}"


def _same_subnet(a: IPAddr, b: IPAddr) -> bool:
    if a.version != b.version:
        return False
    plen = 24 if a.version == 4 else 64
    return b in ipaddress.ip_network(f"{a}/{plen}", strict=False)


def _hca_and_gid(inv: Inventory, route_if: str | None, det: Detection) -> None:
    if not inv.ib_ports:
        det.choices.append(Choice("NCCL_IB_HCA", None, f"no RDMA devices under {inv.root.rstrip('/')}/sys/class/infiniband"))
        return
    active = [p for p in inv.ib_ports if p.active]
    down = [p for p in inv.ib_ports if not p.active]
    if not active:
        det.choices.append(Choice("NCCL_IB_HCA", None, "no RDMA port is ACTIVE: " + _describe(down)))
        det.warnings.append("RDMA devices are present but no port is ACTIVE: NCCL will use TCP sockets")
        return
    chosen = list(active)
    roce = [p for p in active if p.roce]
    master = ipaddress.ip_address(det.master_addr) if det.master_addr else None
    prefer = _prefer_ndevs(inv, route_if)
    if roce:
        picks = {p.name: pick_gid(p, prefer, master) for p in roce}
        usable = {name: g for name, (g, _) in picks.items() if g is not None}
        reasons = "; ".join(r for _, r in picks.values())
        if not usable:
            det.choices.append(Choice("NCCL_IB_GID_INDEX", None, reasons + " — NCCL >= 2.21 picks a GID itself"))
            det.warnings.append("RoCE ports without a usable RoCE v2 GID: check the port's IP configuration")
        else:
            index = _common_index(usable, roce, prefer)
            dropped = [p for p in roce if p.name not in usable or usable[p.name].index != index]
            chosen = [p for p in chosen if p not in dropped]
            why = reasons
            if dropped:
                why += f"; dropped from NCCL_IB_HCA (different GID index): {', '.join(p.name for p in dropped)}"
            det.choices.append(Choice("NCCL_IB_GID_INDEX", str(index), why))
            family = next(g for g in usable.values() if g.index == index)
            if not family.ipv4:
                det.choices.append(Choice("NCCL_SOCKET_FAMILY", "AF_INET6", "the RoCE GID is IPv6: bootstrap over IPv6 too"))
    hca = _hca_value([p.name for p in chosen], [p.device for p in inv.ib_ports])
    why = "active ports: " + _describe(chosen)
    if down:
        why += "; left out (not ACTIVE): " + _describe(down)
    det.choices.append(Choice("NCCL_IB_HCA", hca, why))


def _prefer_ndevs(inv: Inventory, route_if: str | None) -> list[str]:
    """The routing interface first, then (for a VLAN or a bond) its relatives."""
    if not route_if:
        return []
    base = route_if.split(".")[0]
    nif: Optional[NetIf] = inv.interface(base)
    return list(dict.fromkeys([route_if, base, *(nif.slaves if nif else ())]))


def _common_index(usable: dict[str, Gid], roce: list[IBPort], prefer: list[str]) -> int:
    """One index for all HCAs: the most common, ties to the port on the routing interface."""
    counts = Counter(g.index for g in usable.values())
    routing = [usable[p.name].index for p in roce if p.name in usable and set(p.netdevs) & set(prefer)]
    return max(counts, key=lambda i: (counts[i], i in routing, -i))


def _hca_value(ports: list[str], all_devices: list[str]) -> str:
    devices = {p.split(":")[0] for p in ports}
    ambiguous = any(d != o and o.startswith(d) for d in devices for o in all_devices)
    return ("=" if ambiguous else "") + ",".join(ports)


def _describe(ports: list[IBPort]) -> str:
    return ", ".join(
        f"{p.name} ({p.link_layer or '?'}{', ' + p.rate if p.rate else ''}{'' if p.active else ', ' + (p.state or 'state unknown')})"
        for p in ports
    )


# ---------------------------------------------------------------- GPUDirect


def _gdr(inv: Inventory, det: Detection) -> None:
    hsn = any(i.name.startswith("hsn") for i in inv.interfaces)
    if inv.gpu_kind == "amd" and hsn:
        det.choices.append(
            Choice("NCCL_NET_GDR_LEVEL", "3", "AMD GPUs on Slingshot: GPU-direct RDMA up to the host bridge (LUMI's guide; default from ROCm 6.2)")
        )
    elif inv.gpu_kind == "nvidia" and any(p.active for p in inv.ib_ports):
        if inv.peermem:
            det.choices.append(Choice("NCCL_NET_GDR_LEVEL", None, "nvidia_peermem is loaded: NCCL's default GPUDirect RDMA level is right"))
        else:
            det.choices.append(Choice("NCCL_NET_GDR_LEVEL", None, "nvidia_peermem is not loaded: NCCL uses GPUDirect RDMA only through DMA-BUF"))
            det.warnings.append("nvidia_peermem is not loaded: GPUDirect RDMA needs it (or DMA-BUF with a recent driver and NCCL)")
