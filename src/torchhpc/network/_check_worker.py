"""One rank of ``torchhpc net check``: init, all_reduce, report the transport as a JSON line.

Reads the torchrun contract (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT), falling back to Slurm's (SLURM_PROCID, SLURM_NTASKS,
SLURM_LOCALID) so ``srun python -m torchhpc net check --in-job`` works too.
gloo says nothing about its transport, so after the collective this process
lists its own ESTABLISHED TCP connections (``/proc/self/fd`` socket inodes
joined with ``/proc/self/net/tcp*``), drops the store's (MASTER_PORT) and
reports the local addresses and the interfaces that hold them. torch is
imported here only, inside :func:`main`.
"""

from __future__ import annotations

import ipaddress
import json
import os
from typing import Any

_TCP_ESTABLISHED = "01"


def _own_socket_inodes() -> set[str]:
    out = set()
    try:
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                out.add(target[8:-1])
    except OSError:
        pass
    return out


def _hex_addr(text: str) -> tuple[str, int]:
    host, port = text.split(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        addr: Any = ipaddress.IPv4Address(raw[::-1])
    else:  # four little-endian 32-bit words
        addr = ipaddress.IPv6Address(b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4)))
        addr = addr.ipv4_mapped or addr
    return str(addr), int(port, 16)


def connections(skip_port: int | None = None) -> list[dict[str, object]]:
    """This process's established TCP connections, excluding those to/from ``skip_port``."""
    inodes = _own_socket_inodes()
    out: list[dict[str, object]] = []
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _TCP_ESTABLISHED or fields[9] not in inodes:
                continue
            local, lport = _hex_addr(fields[1])
            remote, rport = _hex_addr(fields[2])
            if skip_port is not None and skip_port in (lport, rport):
                continue
            out.append({"local": local, "local_port": lport, "remote": remote, "remote_port": rport})
    return out


def iface_of(addr: str) -> str:
    from torchhpc.network.sysfs import probe

    inv = probe("/")
    ip = ipaddress.ip_address(addr)
    local = inv.local_iface(ip)
    if local:
        return local
    route = inv.route_to(ip)
    return route.iface if route else "?"


def _nccl_debug_to_file(rank: int) -> str | None:
    """Make NCCL (read at communicator init) log INIT/NET lines to a file this rank can parse.

    A user's own NCCL_DEBUG_FILE is respected (then the log is theirs to read).
    """
    if "NCCL_DEBUG_FILE" in os.environ:
        return None
    import tempfile

    path = os.path.join(tempfile.gettempdir(), f"torchhpc-netcheck-{os.getpid()}-{rank}.log")
    os.environ.setdefault("NCCL_DEBUG", "INFO")
    os.environ.setdefault("NCCL_DEBUG_SUBSYS", "INIT,NET")
    os.environ["NCCL_DEBUG_FILE"] = path
    return path


def main() -> int:
    env = os.environ
    rank = int(env.get("RANK", env.get("SLURM_PROCID", env.get("OMPI_COMM_WORLD_RANK", "0"))))
    world = int(env.get("WORLD_SIZE", env.get("SLURM_NTASKS", env.get("OMPI_COMM_WORLD_SIZE", "1"))))
    local_rank = int(env.get("LOCAL_RANK", env.get("SLURM_LOCALID", "0")))
    if "MASTER_ADDR" not in env or "MASTER_PORT" not in env:
        print("TORCHHPC_CHECK " + json.dumps({"rank": rank, "ok": False, "error": "MASTER_ADDR/MASTER_PORT not set"}))
        return 2
    import torch
    import torch.distributed as dist

    backend = env.get("TORCHHPC_CHECK_BACKEND", "auto")
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    device = torch.device("cpu")
    nccl_log = None
    if backend == "nccl":
        device = torch.device("cuda", local_rank % max(1, torch.cuda.device_count()))
        torch.cuda.set_device(device)
        nccl_log = _nccl_debug_to_file(rank)
    dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world)
    t = torch.full((1024,), float(rank + 1), device=device)
    dist.all_reduce(t)
    expected = world * (world + 1) / 2
    ok = bool(torch.all(t == expected).item())
    conns = connections(skip_port=int(env["MASTER_PORT"]))
    ifaces = sorted({iface_of(str(c["local"])) for c in conns})
    report: dict[str, Any] = {
        "rank": rank,
        "world_size": world,
        "backend": backend,
        "ok": ok,
        "sum": float(t[0].item()),
        "expected": expected,
        "host": os.uname().nodename,
        "torch": torch.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if backend == "nccl" else None,
        "connections": conns,
        "ifaces": ifaces,
    }
    dist.barrier()
    dist.destroy_process_group()
    if nccl_log is not None:
        from torchhpc.network.check import parse_nccl_log

        try:
            with open(nccl_log, errors="replace") as f:
                text = f.read()
            os.unlink(nccl_log)
        except OSError as e:
            text = f"# cannot read {nccl_log}: {e.strerror}"
        report["nccl_log"] = text[-200_000:]
        report["nccl_report"] = parse_nccl_log(text).to_dict()
    fabric = ""
    if "nccl_report" in report:
        fabric = f", NCCL fabric {report['nccl_report'].get('fabric')}"
    print(
        f"torchhpc net check: rank {rank}/{world} on {report['host']}: "
        f"{'ok' if ok else 'WRONG SUM'}, {backend} over {','.join(ifaces) or 'no TCP connection'}{fabric}",
        flush=True,
    )
    print("TORCHHPC_CHECK " + json.dumps(report), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
