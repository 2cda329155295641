"""Which nodes of the allocation are alive, and which N of them the next attempt runs on.

The liveness check is one TCP connection to the node's slurmd (``SlurmdPort``, 6818 by
default), with a short timeout: a node that lost power or its link does not answer, a busy
one does (the kernel completes the handshake; slurmd need not be scheduled). Cost: one
handshake per node per check, about 0.1 ms of the batch host's time and three packets; no
process starts, nothing runs on the node, and Slurm's own SlurmdTimeout is not waited for.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterable, Sequence

from torchhpc.core.proc import Runner

__all__ = ["DEFAULT_SLURMD_PORT", "alive", "choose", "hostnames", "ipv4", "slurmd_port"]

DEFAULT_SLURMD_PORT = 6818


def slurmd_port(runner: Runner) -> int:
    """The cluster's SlurmdPort (``scontrol show config``), 6818 when it cannot be read."""
    done = runner.run(["scontrol", "show", "config"], check=False, timeout=30)
    m = re.search(r"^SlurmdPort\s*=\s*(\d+)", done.stdout, re.M)
    return int(m.group(1)) if m else DEFAULT_SLURMD_PORT


def hostnames(runner: Runner, nodelist: str) -> list[str]:
    """``node[1-3]`` -> ``["node1", "node2", "node3"]``, in the allocation's order."""
    done = runner.run(["scontrol", "show", "hostnames", nodelist], timeout=30)
    return done.stdout.split()


def ipv4(host: str) -> str:
    """The host's IPv4 address (torch's TCPStore prefers an address), else its name."""
    try:
        return str(socket.getaddrinfo(host, None, socket.AF_INET)[0][4][0])
    except OSError:
        return host


def alive(host: str, port: int, timeout: float = 2.0) -> bool:
    """Whether ``host`` accepts a TCP connection on ``port`` within ``timeout`` seconds."""
    try:
        with socket.create_connection((ipv4(host), port), timeout=timeout):
            return True
    except OSError:
        return False


def choose(allocation: Sequence[str], previous: Sequence[str], usable: Iterable[str], n: int) -> list[str]:
    """N usable nodes: the previous attempt's survivors first (their caches are warm), then the
    spares, in the allocation's order. Fewer than N when fewer are usable."""
    ok = set(usable)
    keep = [h for h in previous if h in ok]
    more = [h for h in allocation if h in ok and h not in keep]
    picked = set((keep + more)[:n])
    return [h for h in allocation if h in picked]
