"""Prove which transport a collective really used.

Two sources of truth:

* NCCL/RCCL with ``NCCL_DEBUG=INFO`` print their choices (``NET/IB : Using
  [0]mlx5_0:1/RoCE``, ``Using network Socket``, ``Channel 00/0 : 0[0] -> 1[0]
  [send] via NET/IB/0/GDRDMA``); :func:`parse_nccl_log` reads them and
  :func:`verdict` fails with a HINT when the fabric was expected but TCP
  sockets carried the traffic (5 vs 25 GB/s in one user's report).
* gloo prints nothing, so its worker (:mod:`torchhpc.network._check_worker`)
  looks at its own established TCP connections in ``/proc/self/net/tcp*``
  after an all_reduce and maps their local addresses to interfaces.

:func:`run_local` starts the ranks itself (bare ``subprocess`` with the
torchrun environment contract, each in its own session, killed as a group on
timeout), which is the cheapest correct launcher (see shared/README §3).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from torchhpc.core.processes import killpg
from torchhpc.errors import JobFailed, UsageError

__all__ = [
    "NcclReport",
    "RankResult",
    "Verdict",
    "free_port",
    "parse_nccl_log",
    "run_local",
    "verdict",
]

@dataclass
class NcclReport:
    """What an ``NCCL_DEBUG=INFO`` log says about the network (one or many ranks, merged)."""

    version: Optional[str] = None
    network: Optional[str] = None  # "IB", "Socket", or a plugin's name ("AWS Libfabric")
    ib_devices: list[str] = field(default_factory=list)  # "mlx5_0:1/RoCE"
    socket_ifaces: list[str] = field(default_factory=list)  # NET/Socket interfaces
    oob_ifaces: list[str] = field(default_factory=list)  # bootstrap / OOB interfaces
    transports: dict[str, int] = field(default_factory=dict)  # "NET/IB": 8, "P2P": 4, "SHM": 2
    gdr: bool = False
    ofi_provider: Optional[str] = None
    warnings: list[str] = field(default_factory=list)

    @property
    def fabric(self) -> Optional[str]:
        """``"ib"``, ``"socket"``, ``"plugin"`` or ``None`` (nothing crossed a network)."""
        nets = [t for t in self.transports if t.startswith("NET/")]
        if nets:
            if any(t == "NET/IB" for t in nets):
                return "ib"
            if all(t == "NET/Socket" for t in nets):
                return "socket"
            return "plugin"
        if self.network:
            return {"ib": "ib", "socket": "socket"}.get(self.network.lower(), "plugin")
        if self.ib_devices:
            return "ib"
        if self.socket_ifaces:
            return "socket"
        return None

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["fabric"] = self.fabric
        return d


_VERSION = re.compile(r"NCCL version (\S+)")
_RCCL_VERSION = re.compile(r"RCCL version (\S+)")
_USING_NET = re.compile(r"Using network (.+?)\s*$")
_NET_IB = re.compile(r"NET/IB\s*:\s*Using (.*)$")
_IB_DEV = re.compile(r"\[\d+\]([\w.\-]+:\d+)/(IB|RoCE)")
_NET_SOCKET = re.compile(r"NET/Socket\s*:\s*Using (.*)$")
_IFACE = re.compile(r"\[\d+\]([\w.\-]+):[0-9a-fA-F.:%\w]+<\d+>")
_OOB = re.compile(r"OOB ([\w.\-]+):")
_BOOTSTRAP = re.compile(r"Bootstrap\s*:\s*Using ([\w.\-]+):")
_VIA = re.compile(r"via (NET/[^/\n]+(?:/\d+)?(?:/GDRDMA)?|P2P/\S+|SHM\S*|COLLNET/\S+)")
_OFI = re.compile(r"NET/OFI Selected [Pp]rovider is (\w+)")


def parse_nccl_log(text: str) -> NcclReport:
    """Read NCCL/RCCL ``NCCL_DEBUG=INFO`` output (any ranks interleaved; other output ignored)."""
    rep = NcclReport()
    for line in text.splitlines():
        if "CCL" not in line and "via " not in line:
            continue
        if m := _VERSION.search(line) or _RCCL_VERSION.search(line):
            rep.version = rep.version or m.group(1)
        if m := _USING_NET.search(line):
            rep.network = m.group(1)
        if m := _NET_IB.search(line):
            for dev, kind in _IB_DEV.findall(m.group(1)):
                _add(rep.ib_devices, f"{dev}/{kind}")
            if o := _OOB.search(m.group(1)):
                _add(rep.oob_ifaces, o.group(1))
        if m := _NET_SOCKET.search(line):
            for iface in _IFACE.findall(m.group(1)):
                _add(rep.socket_ifaces, iface)
        if m := _BOOTSTRAP.search(line):
            _add(rep.oob_ifaces, m.group(1))
        if m := _OFI.search(line):
            rep.ofi_provider = m.group(1)
        if "NET/IB" in line and "No device found" in line:
            _add(rep.warnings, "NET/IB found no device: NCCL cannot use InfiniBand/RoCE on this node")
        if " NCCL WARN " in line or line.lstrip().startswith("NCCL WARN"):
            _add(rep.warnings, line.split("NCCL WARN", 1)[1].strip())
        for via in _VIA.findall(line):
            kind = _transport_kind(via)
            rep.transports[kind] = rep.transports.get(kind, 0) + 1
            if via.endswith("/GDRDMA"):
                rep.gdr = True
    return rep


def _transport_kind(via: str) -> str:
    if via.startswith("NET/"):
        return "NET/" + via.split("/")[1]
    return via.split("/")[0]


def _add(items: list[str], value: str) -> None:
    if value not in items:
        items.append(value)


@dataclass(frozen=True)
class Verdict:
    status: str  # "pass", "warn", "fail"
    message: str
    hint: Optional[str] = None


def verdict(rep: NcclReport, expect: str = "fabric") -> Verdict:
    """Judge a report: ``expect`` is ``fabric`` (IB/RoCE/plugin), ``socket`` or ``any``."""
    if expect not in ("fabric", "socket", "any"):
        raise UsageError(f"--expect {expect!r} is not one of fabric, socket, any")
    fabric = rep.fabric
    where = _where(rep)
    if fabric is None:
        return Verdict(
            "warn",
            "no NCCL network lines: the ranks talked over shared memory/P2P only, or NCCL_DEBUG was not INFO",
            "run across at least 2 nodes with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET",
        )
    if expect == "fabric" and fabric == "socket":
        return Verdict(
            "fail",
            f"NCCL used TCP sockets ({where}), not the RDMA fabric",
            "check `torchhpc net detect`: NCCL_IB_HCA must name an ACTIVE port, RoCE needs the RoCE v2 "
            "NCCL_IB_GID_INDEX, containers need /dev/infiniband (NCCL_NET=IB "
            "makes a fallback an error, at the cost of bypassing an external net plugin)",
        )
    if expect == "socket" and fabric != "socket":
        return Verdict("warn", f"expected sockets but NCCL used {fabric} ({where})")
    return Verdict("pass", f"NCCL used {fabric} ({where})")


def _where(rep: NcclReport) -> str:
    bits = []
    if rep.network:
        bits.append(f"network {rep.network}")
    if rep.ib_devices:
        bits.append("HCAs " + ",".join(rep.ib_devices))
    if rep.socket_ifaces:
        bits.append("interfaces " + ",".join(rep.socket_ifaces))
    if rep.ofi_provider:
        bits.append(f"OFI provider {rep.ofi_provider}")
    if rep.transports:
        bits.append("channels " + ", ".join(f"{k}x{v}" for k, v in sorted(rep.transports.items())))
    if rep.gdr:
        bits.append("GPUDirect RDMA")
    return "; ".join(bits) or "no details"


# ---------------------------------------------------------------- running ranks


@dataclass
class RankResult:
    """One rank's report from the worker (its JSON line), plus its captured output."""

    rank: int
    returncode: Optional[int]
    report: dict[str, Any]
    output: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and bool(self.report.get("ok"))

    @property
    def ifaces(self) -> list[str]:
        return [str(i) for i in self.report.get("ifaces") or []]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free right now (the kernel's choice; a small race is inherent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def run_local(
    nproc: int = 2,
    backend: str = "gloo",
    master_addr: str = "127.0.0.1",
    master_port: int | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 120.0,
    python: str = sys.executable,
) -> list[RankResult]:
    """Start ``nproc`` worker ranks on this machine and collect their reports."""
    if nproc < 2:
        raise UsageError(f"--nproc {nproc} cannot exercise a network", "use at least 2 ranks")
    port = master_port or free_port(master_addr if master_addr != "localhost" else "127.0.0.1")
    base = dict(os.environ if env is None else env)
    if backend == "nccl":
        base.update({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"})
    procs = []
    for rank in range(nproc):
        penv = {
            **base,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(nproc),
            "LOCAL_WORLD_SIZE": str(nproc),
            "GROUP_RANK": "0",
            "NODE_RANK": "0",
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(port),
            "TORCHHPC_CHECK_BACKEND": backend,
        }
        procs.append(
            subprocess.Popen(
                [python, "-m", "torchhpc.network._check_worker"],
                env=penv,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
        )
    deadline = time.monotonic() + timeout
    results: list[RankResult] = []
    timed_out = False
    try:
        for rank, p in enumerate(procs):
            try:
                out, _ = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_all(procs)
                out, _ = p.communicate()
            # A rank we killed at the deadline did not finish: None, as for a timeout.
            rc: Optional[int] = None if timed_out and p.returncode == -signal.SIGKILL else p.returncode
            results.append(RankResult(rank, rc, _report_line(out), out))
    finally:
        _kill_all(procs)
    if all(r.returncode is None for r in results):
        raise JobFailed(
            f"the {nproc}-rank {backend} check did not finish in {timeout:.0f}s",
            "a hang at init usually means the ranks cannot reach MASTER_ADDR; try --master 127.0.0.1",
        )
    return results


def _kill_all(procs: Sequence[subprocess.Popen[str]]) -> None:
    for p in procs:
        if p.poll() is None:
            killpg(p.pid, signal.SIGKILL)


def _report_line(output: str) -> dict[str, Any]:
    for line in reversed(output.splitlines()):
        if line.startswith("TORCHHPC_CHECK "):
            try:
                data = json.loads(line[len("TORCHHPC_CHECK ") :])
            except json.JSONDecodeError:
                continue
            if isinstance(data, dict):
                return data
    return {}
