"""Checks of the job around the node: interface to the master, rendezvous port, Slurm, container runtimes,
task geometry. Checks of the environment a rank sees (variables that disagree with its rank) belong here too."""

from __future__ import annotations

import errno
import re
import socket
from collections.abc import Mapping
from typing import Optional

from torchhpc.core.units import counted
from torchhpc.doctor.base import Check, Context
from torchhpc.doctor.node import requested_gpus
from torchhpc.errors import CommandError, EnvironmentDetectionError

__all__ = ["check_containers", "check_environment", "check_geometry", "check_interface", "check_port", "check_slurm"]


def _master(ctx: Context) -> Optional[str]:
    return ctx.master or ctx.environ.get("MASTER_ADDR")


def check_interface(ctx: Context) -> Check:
    from torchhpc.network.select import detect
    from torchhpc.network.sysfs import probe

    inv = probe(ctx.root)
    master = _master(ctx)
    user = ctx.environ.get("NCCL_SOCKET_IFNAME")
    if user:
        names = [i.name for i in inv.interfaces if i.up]
        missing = [p for p in user.lstrip("^").split(",") if p and not user.startswith("^")
                   and not any(n == p.lstrip("=") or (not p.startswith("=") and n.startswith(p)) for n in names)]
        if missing:
            return Check("interface", "fail", f"NCCL_SOCKET_IFNAME={user} but no interface that is up matches {','.join(missing)}",
                         f"interfaces up here: {', '.join(names)}; see `torchhpc net detect`")
    if not master:
        det = detect(inv, None)
        return Check("interface", "skip" if not ctx.in_job else "warn",
                     f"no MASTER_ADDR/--master; would use {det.get('NCCL_SOCKET_IFNAME') or 'nothing'}",
                     None if not ctx.in_job else "set MASTER_ADDR (or pass --master) to check the route")
    det = detect(inv, master, nodes=_nodes(ctx.environ))
    chosen = next((c for c in det.choices if c.name == "NCCL_SOCKET_IFNAME"), None)
    if chosen is None or chosen.value is None:
        return Check("interface", "fail", chosen.reason if chosen else f"cannot choose an interface for {master}",
                     "check MASTER_ADDR resolves here (getent ahostsv4) and a route reaches it (ip route get)")
    iface = chosen.value.lstrip("=").split(",")[0]
    nif = inv.interface(iface)
    if nif is not None and nif.container_or_virtual and "single node" not in chosen.reason:
        return Check("interface", "fail", chosen.reason, "other nodes cannot reach this one through a virtual interface")
    return Check("interface", "pass", f"{chosen.value}: {chosen.reason}")


def _nodes(e: Mapping[str, str]) -> Optional[int]:
    return next((int(e[name]) for name in ("SLURM_JOB_NUM_NODES", "SLURM_NNODES") if e.get(name, "").isdigit()), None)


def check_port(ctx: Context) -> Check:
    e = ctx.environ
    port = ctx.port or int(e.get("MASTER_PORT", "29500") or 29500)
    master = _master(ctx)
    if ctx.in_job and master and not _is_local(master):
        return Check("port", "skip", f"port {port} is opened on the master {master}, not here")
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", port))
    except OSError as err:
        if err.errno == errno.EADDRINUSE:
            return Check("port", "warn" if not ctx.in_job else "fail", f"port {port} is in use on this machine",
                         "another torchrun/job holds it: pick MASTER_PORT from the job id (torchhpc does) "
                         "or --master-port")
        return Check("port", "warn", f"cannot bind port {port}: {err.strerror}")
    return Check("port", "pass", f"port {port} is free")


def _is_local(host: str) -> bool:
    if host in ("localhost", socket.gethostname(), socket.getfqdn()):
        return True
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    for family, *_x, sa in infos:
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.bind((str(sa[0]), 0))
            return True
        except OSError:
            continue
    return False


def check_slurm(ctx: Context) -> Check:
    from torchhpc.schedulers import get_scheduler

    slurm = get_scheduler("slurm", ctx.runner)
    missing = slurm.missing_clients()
    present = [c for c in slurm.clients if c not in missing]
    if not present:
        return Check("slurm", "skip", f"no Slurm client ({'/'.join(slurm.clients)}) on PATH")
    conf = ctx.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf"
    if not ctx.path(conf).exists() and "SLURM_JOB_ID" not in ctx.environ:
        return Check("slurm", "warn", f"{','.join(present)} installed but {conf} does not exist: no cluster configured here",
                     "on a cluster login node, set SLURM_CONF or load the site's slurm module")
    if "scontrol" in missing:
        return Check("slurm", "warn", f"found {','.join(present)} but not {','.join(missing)}")
    up, said = slurm.controller()
    if not up:
        return Check("slurm", "fail", said, "the controller does not answer: is SLURM_CONF right, the controller up, munge running?")
    detail = f"{', '.join(present)} on PATH; {said.removeprefix('scontrol ping: ')}"
    if missing:
        return Check("slurm", "warn", detail + f"; missing {','.join(missing)}")
    return Check("slurm", "pass", detail)


# (name, argv, regex the first output line must match; "" for any)
_RUNTIMES = (
    ("apptainer", ["apptainer", "--version"], r"^apptainer version \d"),
    ("singularity", ["singularity", "--version"], r"^(singularity(-ce)?|apptainer) version \d"),
    ("podman", ["podman", "--version"], r"^podman version \d"),
    ("docker", ["docker", "version", "--format", "{{.Server.Version}}"], ""),
    ("enroot", ["enroot", "version"], ""),
    ("charliecloud", ["ch-run", "--version"], ""),
)


_RUNTIME_HINTS = (
    ("Docker daemon", "a docker client without a reachable daemon cannot run containers"),
    ("not the container runtime", "Debian's `singularity` package is a game: install apptainer"),
    ("$USER not set", "ch-run needs $USER: export USER=$(id -un)"),
)


def check_containers(ctx: Context) -> Check:
    usable, broken = [], []
    for name, argv, must in _RUNTIMES:
        if not ctx.runner.which(argv[0]):
            continue
        try:
            done = ctx.runner.run(argv, check=False, timeout=20)
        except CommandError as e:
            broken.append(f"{name} ({e.message})")
            continue
        text = (done.stdout.strip() or done.stderr.strip()).splitlines()
        first = text[0] if text else ""
        if done.returncode != 0:
            broken.append(f"{name} (exit {done.returncode}: {first[:60]})")
        elif must and not re.match(must, first.lower()):
            broken.append(f"{name} is not the container runtime ({first[:40]!r})")
        else:
            usable.append(f"{name} {first.split()[-1] if first else ''}".strip())
    if not usable and not broken:
        return Check("containers", "skip", "no container runtime on PATH (apptainer, singularity, podman, docker, enroot, ch-run)")
    detail = "usable: " + (", ".join(usable) or "none")
    if broken:
        detail += "; not usable: " + ", ".join(broken)
        why = " ".join(broken)
        hints = [h for key, h in _RUNTIME_HINTS if key in why] or ["run the runtime's --version by hand to see why"]
        return Check("containers", "warn" if usable else "fail", detail, "; ".join(hints))
    return Check("containers", "pass", detail)


def _tasks_per_node(e: Mapping[str, str]) -> tuple[Optional[int], str]:
    """Tasks per node of this step (``4(x2)``, ``2,1`` formats), else of the job."""
    for name in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        value = e.get(name, "")
        counts = [part.split("(")[0] for part in value.split(",") if part]
        if counts and all(c.isdigit() for c in counts):
            return max(int(c) for c in counts), name
    return None, ""


def check_geometry(ctx: Context) -> Check:
    e = ctx.environ
    if not ctx.in_job:
        return Check("geometry", "skip", "not inside a job")
    n, source = _tasks_per_node(e)
    torchrun = "TORCHELASTIC_RUN_ID" in e or "TORCHELASTIC_RESTART_COUNT" in e
    if n is None:
        return Check("geometry", "skip", "not a Slurm job step (no SLURM_*TASKS_PER_NODE)")
    if torchrun and n != 1:
        return Check("geometry", "fail",
                     f"torchrun runs under {source}={n}: {n} torchrun copies per node each start "
                     f"LOCAL_WORLD_SIZE={e.get('LOCAL_WORLD_SIZE', '?')} workers",
                     "torchrun is one task per node: --ntasks-per-node=1 (torchhpc --launcher torchrun sets it)")
    if torchrun:
        return Check("geometry", "pass", f"torchrun, one task per node, LOCAL_WORLD_SIZE={e.get('LOCAL_WORLD_SIZE', '?')}")
    requested, _ = requested_gpus(ctx)
    world, ntasks = e.get("WORLD_SIZE"), e.get("SLURM_NTASKS")
    if world and ntasks and world != ntasks:
        return Check("geometry", "fail", f"WORLD_SIZE={world} but SLURM_NTASKS={ntasks}",
                     "with srun/mpirun one task is one rank: drop the hand-set WORLD_SIZE or fix --ntasks")
    if requested and n != requested:
        return Check("geometry", "warn", f"{n} tasks per node for {requested} GPUs per node",
                     "with srun launching ranks directly, use one task per GPU (--ntasks-per-node = GPUs per node)")
    return Check("geometry", "pass", f"{counted(n, 'task')} per node ({source})" + (f", {counted(requested, 'GPU')} per node" if requested else ""))


def check_environment(ctx: Context) -> Check:
    """Rank/world variables other frameworks read (SLURM_*, OMPI_*, PMI_*) that name another rank or world.

    The logic lives in :mod:`torchhpc.env.compat` (shared with ``torchhpc env --explain``).
    """
    from torchhpc.env import detect
    from torchhpc.env.compat import disagreements

    if not ctx.in_job:
        return Check("environment", "skip", "not inside a job")
    try:
        dist_env = detect(ctx.environ)
    except EnvironmentDetectionError as e:
        return Check("environment", "fail", f"cannot tell this process's rank: {e.message}", e.hint)
    found = disagreements(dist_env, ctx.environ)
    if not found:
        return Check("environment", "pass",
                     f"rank {dist_env.rank}/{dist_env.world_size} ({dist_env.source}); no variable names another rank")
    more = f" (and {len(found) - 1} more: {', '.join(d.name for d in found[1:])})" if len(found) > 1 else ""
    return Check("environment", "fail", found[0].message + more, found[0].hint)
