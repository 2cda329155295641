"""Fault injection: slow one node's link with ``tc tbf`` (``netem`` is not in every kernel).

A node's link is the veth pair ``vnI`` (in the controller namespace, on the
bridge) <-> ``eth0`` (in the node namespace). A token-bucket filter on both
ends limits the node's traffic in both directions, so every pair the node is
part of becomes slow and no other pair does: the fault ``bench nodes`` must
find. ``restore`` deletes both qdiscs. Nothing outside the cluster's own
namespaces is touched.
"""

from __future__ import annotations

import re

from torchhpc.core.proc import Runner, default_runner
from torchhpc.devcluster.state import ClusterState
from torchhpc.errors import CommandError, DevClusterError, UsageError

__all__ = ["degrade", "link_of", "parse_rate", "restore", "shaped"]

_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
          "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9}
_RATE = re.compile(r"^(\d+(?:\.\d+)?)([a-z]+)$")
# tbf needs a bucket of at least rate/HZ; 10 ms worth of traffic is safe for HZ >= 100.
_MIN_BURST = 4096
_LATENCY = "50ms"


def parse_rate(text: str) -> float:
    """``"100mbit"`` -> bits per second, in tc's units (bit, kbit, mbit, gbit; bps = bytes/s)."""
    m = _RATE.match(str(text).strip().lower())
    if not m or m.group(2) not in _UNITS or float(m.group(1)) <= 0:
        raise UsageError(f"--rate {text!r} is not a link rate",
                         "write it the way tc does: 100mbit, 1gbit, 500kbit (bit/s) or 50mbps (bytes/s)")
    return float(m.group(1)) * _UNITS[m.group(2)]


def link_of(state: ClusterState, node: str) -> list[tuple[str, str]]:
    """The two ends of ``node``'s link: ``[(controller netns, "vnI"), (node netns, "eth0")]``."""
    if node not in state.nodes:
        raise UsageError(f"{node!r} is not a node of the dev cluster at {state.state_dir}",
                         f"nodes are {', '.join(state.nodes)}")
    index = state.nodes.index(node) + 1  # netns.create names the veths vn1..vnN in node order
    return [(state.netns(state.controller), f"vn{index}"), (state.netns(node), "eth0")]


def _tc(runner: Runner, netns: str, *args: str, check: bool = True) -> str:
    done = runner.run(["tc", "-n", netns, *args], check=check, timeout=10,
                      hint="tc (iproute2) must run as root on the dev cluster's machine")
    return done.stdout


def degrade(state: ClusterState, node: str, rate: str, runner: Runner | None = None) -> float:
    """Limit ``node``'s link to ``rate`` both ways; returns the rate in bit/s. Replaces an earlier limit."""
    bits = parse_rate(rate)
    runner = runner or default_runner()
    burst = max(_MIN_BURST, int(bits / 8 / 100))
    for netns, dev in link_of(state, node):
        try:
            _tc(runner, netns, "qdisc", "replace", "dev", dev, "root", "tbf",
                "rate", f"{int(bits)}bit", "burst", str(burst), "latency", _LATENCY)
        except CommandError as e:
            raise DevClusterError(f"could not shape {node}'s link ({dev} in {netns}): {e.message}",
                                  "is the dev cluster up (`torchhpc devcluster status`) and are you root?") from None
    return bits


def restore(state: ClusterState, node: str, runner: Runner | None = None) -> bool:
    """Remove the limit from ``node``'s link; True when there was one (restoring twice is fine)."""
    runner = runner or default_runner()
    had = False
    for netns, dev in link_of(state, node):
        if "tbf" in _tc(runner, netns, "qdisc", "show", "dev", dev, check=False):
            had = True
            _tc(runner, netns, "qdisc", "del", "dev", dev, "root", check=False)
    return had


def shaped(state: ClusterState, runner: Runner | None = None) -> dict[str, str]:
    """Node -> its tbf rate as tc prints it (e.g. ``800Mbit``), for the nodes that have one."""
    runner = runner or default_runner()
    out: dict[str, str] = {}
    for node in state.nodes:
        netns, dev = link_of(state, node)[0]
        m = re.search(r"\btbf\b.*?\brate (\S+)", _tc(runner, netns, "qdisc", "show", "dev", dev, check=False))
        if m:
            out[node] = m.group(1)
    return out
