"""Checks of the node itself: Python, torch, GPUs, /dev/shm, ulimits, RDMA devices, pip vs the base torch."""

from __future__ import annotations

import os
import platform
import resource
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Optional

from torchhpc.core.units import counted
from torchhpc.doctor.base import Check, Context, GiB, MiB

__all__ = [
    "check_gpus", "check_memlock", "check_pip_torch", "check_python", "check_rdma", "check_shm", "check_stack",
    "check_torch", "requested_gpus", "visible_list",
]


def check_python(ctx: Context) -> Check:
    v = sys.version_info
    detail = f"Python {platform.python_version()} ({ctx.python})"
    if v < (3, 9):
        return Check("python", "fail", detail, "torchhpc needs Python >= 3.9")
    return Check("python", "pass", detail)


def check_torch(ctx: Context) -> Check:
    info = ctx.torch_info()
    if str(info.get("error", "")).startswith("skipped"):
        return Check("torch", "skip", "not probed (--no-torch)")
    if "error" in info:
        status = "fail" if ctx.in_job else "warn"
        detail = f"torch does not import: {info['error']}"
        return Check("torch", status, detail, "install torch in this environment (or use the container's python)"
                     + ("" if ctx.in_job else "; on a login node it is optional: jobs render without it"))
    bits = [f"torch {info['version']}"]
    if info.get("cuda"):
        bits.append(f"CUDA {info['cuda']}")
    if info.get("hip"):
        bits.append(f"HIP {info['hip']}")
    if info.get("nccl"):
        bits.append(f"{'RCCL' if info.get('hip') else 'NCCL'} {info['nccl']}")
    backends = [b for b in ("nccl", "gloo") if info.get(f"{b}_backend")]
    bits.append("backends " + (",".join(backends) or "none"))
    if not info.get("cuda") and not info.get("hip"):
        bits.append("CPU-only build")
    return Check("torch", "pass", ", ".join(bits))


def requested_gpus(ctx: Context) -> tuple[Optional[int], str]:
    if ctx.gpus is not None:
        return ctx.gpus, "--gpus"
    e = ctx.environ
    if e.get("SLURM_GPUS_ON_NODE", "").isdigit():
        return int(e["SLURM_GPUS_ON_NODE"]), "SLURM_GPUS_ON_NODE"
    per_node = e.get("SLURM_GPUS_PER_NODE", "")
    if per_node:
        tail = per_node.split(":")[-1]
        if tail.isdigit():
            return int(tail), "SLURM_GPUS_PER_NODE"
    for name in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        if e.get(name):
            return len(e[name].split(",")), name
    return None, ""


def visible_list(ctx: Context) -> tuple[Optional[list[str]], str]:
    e = ctx.environ
    for name in ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"):
        if name in e:
            value = e[name].strip()
            return ([] if value in ("", "-1", "NoDevFiles") else value.split(",")), name
    return None, ""


def check_gpus(ctx: Context) -> Check:
    requested, req_src = requested_gpus(ctx)
    visible_env, vis_src = visible_list(ctx)
    info = ctx.torch_info()
    count: Optional[int] = info.get("device_count") if "error" not in info else None
    if count is None:
        nodes = sorted(ctx.path("/dev").glob("nvidia[0-9]*"))
        if not nodes and ctx.path("/dev/kfd").exists():
            nodes = sorted(ctx.path("/dev/dri").glob("renderD*"))
        count = len(nodes) if visible_env is None else min(len(nodes), len(visible_env))
    where = f" ({vis_src}={','.join(visible_env)})" if visible_env is not None else ""
    local = ctx.environ.get("LOCAL_RANK", ctx.environ.get("SLURM_LOCALID"))
    rank_txt = f"local rank {local} sees " if ctx.in_job and local is not None else ""
    if count == 0:
        if requested:
            return Check("gpus", "fail", f"{counted(requested, 'GPU')} requested ({req_src}) but {rank_txt}none visible{where}",
                         "check the container passes GPUs (apptainer --nv/--rocm, docker --gpus all) and "
                         "that CUDA_VISIBLE_DEVICES is not emptied")
        return Check("gpus", "warn", f"no GPU visible{where}: gloo on CPU only", None)
    detail = f"{rank_txt}{counted(count, 'GPU')} visible{where}"
    if requested is not None:
        detail += f", {requested} requested ({req_src})"
        if count < requested and not (ctx.in_job and count == 1 and local is not None):
            return Check("gpus", "warn", detail,
                         "fewer GPUs visible than requested: --gpu-bind/--gpus-per-task restrict each task, or a "
                         "container hides some")
    return Check("gpus", "pass", detail)


def check_shm(ctx: Context) -> Check:
    path = ctx.path("/dev/shm")
    try:
        st = os.statvfs(path)
    except OSError as e:
        return Check("/dev/shm", "fail", f"cannot stat {path}: {e.strerror}", "containers need /dev/shm (docker --ipc=host)")
    size = st.f_blocks * st.f_frsize
    free = st.f_bavail * st.f_frsize
    detail = f"{size / GiB:.1f} GiB ({free / GiB:.1f} GiB free)"
    if size < 1 * GiB:
        return Check("/dev/shm", "warn" if size >= 256 * MiB else "fail", detail,
                     "DataLoader workers and NCCL's shared-memory transport need more: docker --ipc=host or "
                     "--shm-size=16g, RunAI --large-shm, Kubernetes an emptyDir with medium: Memory")
    return Check("/dev/shm", "pass", detail)


def _limit_text(v: int) -> str:
    return "unlimited" if v == resource.RLIM_INFINITY else f"{v // 1024} KiB"


def check_memlock(ctx: Context, limits: Callable[[int], tuple[int, int]] = resource.getrlimit) -> Check:
    soft, _hard = limits(resource.RLIMIT_MEMLOCK)
    rdma = bool(_rdma_devices(ctx))
    detail = f"ulimit -l = {_limit_text(soft)}"
    if soft == resource.RLIM_INFINITY:
        return Check("memlock", "pass", detail)
    hint = ("RDMA pins memory: raise it (docker --ulimit memlock=-1, limits.conf `* - memlock unlimited`, "
            "Slurm PropagateResourceLimitsExcept=MEMLOCK)")
    if rdma:
        return Check("memlock", "fail", detail + " with RDMA devices present", hint)
    return Check("memlock", "warn", detail + " (matters only with InfiniBand/RoCE)", hint)


def check_stack(ctx: Context, limits: Callable[[int], tuple[int, int]] = resource.getrlimit) -> Check:
    soft, _hard = limits(resource.RLIMIT_STACK)
    detail = f"ulimit -s = {_limit_text(soft)}"
    if soft != resource.RLIM_INFINITY and soft < 8 * MiB:
        return Check("stack", "warn", detail, "NGC containers expect 64 MiB (docker --ulimit stack=67108864, the MareNostrum5 guide)")
    return Check("stack", "pass", detail)


def _rdma_devices(ctx: Context) -> list[str]:
    try:
        return sorted(os.listdir(ctx.path("/sys/class/infiniband")))
    except OSError:
        return []


def check_rdma(ctx: Context) -> Check:
    from torchhpc.network.sysfs import probe

    devices = _rdma_devices(ctx)
    if not devices:
        return Check("rdma", "skip", "no RDMA devices in /sys/class/infiniband (NCCL will use TCP sockets)")
    uverbs = sorted(p.name for p in ctx.path("/dev/infiniband").glob("uverbs*"))
    ports = probe(ctx.root).ib_ports
    active = [p.name for p in ports if p.active]
    detail = f"{counted(len(devices), 'device')} {','.join(devices)}; ACTIVE ports: {','.join(active) or 'none'}"
    if not uverbs:
        return Check("rdma", "fail", detail + "; /dev/infiniband/uverbs* missing",
                     "the container cannot open the HCAs: docker --device=/dev/infiniband, Kubernetes rdma/rdma "
                     "resource (RunAI --extended-resource rdma/rdma=1)")
    if not active:
        return Check("rdma", "fail", detail, "no port is ACTIVE: check cables/subnet manager (ibstat)")
    return Check("rdma", "pass", detail + f"; {counted(len(uverbs), 'uverbs device')}")


def check_pip_torch(ctx: Context) -> Check:
    info = ctx.torch_info()
    if str(info.get("error", "")).startswith("skipped"):
        return Check("pip-torch", "skip", "not probed (--no-torch)")
    if "error" in info:
        return Check("pip-torch", "skip", "torch not importable")
    e = ctx.environ
    constraint = e.get("PIP_CONSTRAINT", "")
    pinned = False
    for path in constraint.split():
        try:
            pinned = pinned or any(ln.strip().lower().startswith("torch==") for ln in Path(path).read_text().splitlines())
        except OSError:
            continue
    if pinned:
        return Check("pip-torch", "pass", f"PIP_CONSTRAINT={constraint} pins torch: pip cannot replace it")
    location = str(info.get("file", ""))
    venv = e.get("VIRTUAL_ENV") or (sys.prefix if sys.prefix != sys.base_prefix else "")
    version = str(info.get("version", ""))
    custom = ("+" in version and not version.split("+")[1].startswith("cpu")) or "a0" in version
    if venv and (location.startswith(os.path.realpath(venv)) or location.startswith(venv)):
        return Check("pip-torch", "pass", f"torch {version} belongs to this venv ({venv})")
    hint = ("pin it: `pip list --format=freeze | grep -i '^torch' > /tmp/c.txt; export PIP_CONSTRAINT=/tmp/c.txt` "
            "(the GPU-containers guide's constraints file)")
    if venv:
        return Check("pip-torch", "warn",
                     f"torch {version} comes from outside the venv ({location}); a pip install that needs "
                     "another torch version would put a second torch into the venv", hint)
    if custom:
        return Check("pip-torch", "warn", f"torch {version} is a custom build (a base image's): pip may replace it", hint)
    return Check("pip-torch", "pass", f"torch {version} from {location}; no venv in between")
