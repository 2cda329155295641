"""Network namespaces of the dev cluster: one for the controller (holding a
bridge) and one per node, wired with veth pairs.

Each veth is created inside the controller namespace with its peer created
directly in the node namespace, so the host's own network namespace is never
touched: no interface, route or address appears there.
"""

from __future__ import annotations

import os
import re

from torchhpc.core.proc import Runner
from torchhpc.core.shell import join
from torchhpc.devcluster.config import BRIDGE, CONTROLLER, LOGIN, Layout

__all__ = ["create", "delete", "existing", "in_namespace", "netns_path", "pids_in"]

NETNS_DIR = "/run/netns"


def netns_path(name: str) -> str:
    return os.path.join(NETNS_DIR, name)


def existing(prefix: str, runner: Runner) -> list[str]:
    """Namespaces that belong to the cluster with this prefix (``PREFIX-ctl``, ``PREFIX-nodeN``).

    The pattern is exact so that a cluster with a longer, hashed prefix beside
    the default one is never matched.
    """
    out = runner.run(["ip", "netns", "list"], timeout=10).stdout
    pattern = re.compile(rf"^{re.escape(prefix)}-({CONTROLLER}|{LOGIN}|node\d+)$")
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    return [n for n in names if pattern.match(n)]


def create(layout: Layout, runner: Runner) -> None:
    """Namespaces, the bridge (controller address on it) and one veth per node (and the login node)."""
    ctl = layout.controller_netns

    def ip(*args: str) -> None:
        runner.run(["ip", *args], timeout=10)

    ip("netns", "add", ctl)
    ip("-n", ctl, "link", "set", "lo", "up")
    ip("-n", ctl, "link", "add", BRIDGE, "type", "bridge")
    ip("-n", ctl, "addr", "add", f"{layout.controller_ip}/{layout.prefix_len}", "dev", BRIDGE)
    ip("-n", ctl, "link", "set", BRIDGE, "address", mac_for(layout.controller_ip))
    ip("-n", ctl, "link", "set", BRIDGE, "up")
    members = [
        (f"vn{i}", layout.node_netns(n), a) for i, (n, a) in enumerate(zip(layout.nodes, layout.node_ips), 1)
    ]
    if layout.login:
        members.append(("vlogin", layout.login_netns, layout.login_ip))
    for veth, ns, addr in members:
        ip("netns", "add", ns)
        ip("-n", ctl, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        ip("-n", ctl, "link", "set", veth, "master", BRIDGE, "up")
        ip("-n", ns, "link", "set", "eth0", "address", mac_for(addr))
        ip("-n", ns, "addr", "add", f"{addr}/{layout.prefix_len}", "dev", "eth0")
        ip("-n", ns, "link", "set", "eth0", "up")
        ip("-n", ns, "link", "set", "lo", "up")
    # Every address is known up front: permanent neighbour entries, so no connection waits on ARP.
    # With 32 nodes on two loaded cores, ARP replies came too late and gloo's connect failed with
    # "No route to host" (EHOSTUNREACH after unanswered neighbour probes).
    hosts = [(layout.controller_ip, BRIDGE, ctl), *((a, "eth0", ns) for _veth, ns, a in members)]
    for own_addr, dev, ns in hosts:
        lines = [
            f"neigh replace {addr} lladdr {mac_for(addr)} dev {dev} nud permanent"
            for addr, _dev, _ns in hosts
            if addr != own_addr
        ]
        runner.run(["ip", "-n", ns, "-batch", "-"], input="\n".join(lines) + "\n", timeout=30)


def mac_for(addr: str) -> str:
    """A fixed, locally administered MAC for a cluster address: 02:00 + the IPv4 bytes."""
    return "02:00:" + ":".join(f"{int(octet):02x}" for octet in addr.split("."))


def delete(names: list[str], runner: Runner) -> list[str]:
    """Delete the given namespaces (their veths go with them); missing ones are fine."""
    deleted = []
    for name in names:
        done = runner.run(["ip", "netns", "delete", name], check=False, timeout=10)
        if done.returncode == 0:
            deleted.append(name)
    return deleted


def pids_in(names: list[str]) -> list[int]:
    """PIDs of processes living in any of these network namespaces (by namespace inode)."""
    wanted = set()
    for name in names:
        try:
            wanted.add(f"net:[{os.stat(netns_path(name)).st_ino}]")
        except OSError:
            continue
    if not wanted:
        return []
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            if os.readlink(f"/proc/{entry}/ns/net") in wanted:
                found.append(int(entry))
        except OSError:
            continue
    return found


def in_namespace(
    netns: str | None, hostname: str | None, binds: dict[str, str], argv: list[str]
) -> list[str]:
    """argv that runs ``argv`` in a node's network namespace with its own hostname and /etc files.

    ``ip netns exec`` would remount /sys, which hides /sys/fs/cgroup and kills
    slurmd; ``nsenter --net`` + ``unshare --mount --uts`` keeps the host's
    mounts and only adds our bind mounts (hosts, resolv.conf) in a private
    mount namespace. Every step execs, so the PID we get is the daemon's.
    """
    steps = [join(["mount", "--bind", src, dst]) for src, dst in binds.items()]
    if hostname:
        steps.append(join(["hostname", hostname]))
    steps.append("exec " + join(argv))
    script = " && ".join(steps)
    out: list[str] = []
    if netns:
        out += ["nsenter", "--net=" + netns_path(netns), "--"]
    out += ["unshare", "--mount", "--uts", "--propagation", "private", "--", "sh", "-c", script]
    return out
