"""``torchhpc doctor``: one table of pass/warn/fail lines, each failure with a HINT.

Runs on a login node (torch optional there) and inside a job (``in_job``):
versions, GPUs visible vs requested, /dev/shm, memlock and stack limits, RDMA
devices inside the container, whether the chosen interface reaches the
master, whether the rendezvous port is free, the Slurm client, container
runtimes, the launcher's task geometry, and whether pip could replace the
base image's torch.

Every check is a small function of a :class:`Context` (environment mapping,
command :class:`~torchhpc.core.proc.Runner`, filesystem root for /sys, /proc
and /dev), so unit tests feed fakes and the real run reads the machine. A
check that cannot apply says ``skip`` with the reason; a machine without GPUs
gets ``warn``/``skip``, never ``fail``, unless GPUs were requested.
"""

from __future__ import annotations

import errno
import json
import os
import platform
import re
import resource
import socket
import sys
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from torchhpc.core.proc import Runner, default_runner
from torchhpc.errors import CommandError, TorchHPCError

__all__ = ["CHECKS", "Check", "Context", "run_checks"]

STATUSES = ("pass", "warn", "fail", "skip")
GiB = 1024**3
MiB = 1024**2


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    detail: str
    hint: Optional[str] = None


@dataclass
class Context:
    """What the checks may look at; every part injectable."""

    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    runner: Runner = field(default_factory=default_runner)
    root: str = "/"
    in_job: Optional[bool] = None  # None: decide from the environment
    master: Optional[str] = None
    port: Optional[int] = None
    gpus: Optional[int] = None  # requested GPUs per node, if known better than the environment
    python: str = sys.executable
    _torch: Optional[dict[str, Any]] = None

    def __post_init__(self) -> None:
        if self.in_job is None:
            e = self.environ
            self.in_job = any(k in e for k in ("SLURM_STEP_ID", "PBS_JOBID", "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"))

    def path(self, p: str) -> Path:
        return Path(self.root) / p.lstrip("/")

    def torch_info(self) -> dict[str, Any]:
        """torch's versions and devices, probed in a child process (a broken CUDA stack cannot crash us)."""
        if self._torch is None:
            try:
                done = self.runner.run([self.python, "-c", _TORCH_PROBE], check=False, timeout=120)
                lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
                self._torch = json.loads(lines[-1]) if lines else {"error": (done.stderr.strip().splitlines() or ["no output"])[-1]}
            except (TorchHPCError, ValueError) as e:
                self._torch = {"error": str(e)}
        return self._torch


_TORCH_PROBE = r"""
import json, sys
try:
    import torch
except Exception as e:
    print(json.dumps({"error": "%s: %s" % (type(e).__name__, e)})); sys.exit(0)
out = {"version": torch.__version__, "file": torch.__file__, "cuda": torch.version.cuda,
       "hip": getattr(torch.version, "hip", None), "cuda_available": torch.cuda.is_available()}
out["device_count"] = torch.cuda.device_count() if out["cuda_available"] else 0
try:
    out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
except Exception:
    out["nccl"] = None
import torch.distributed as dist
out["nccl_backend"] = dist.is_available() and dist.is_nccl_available()
out["gloo_backend"] = dist.is_available() and dist.is_gloo_available()
print(json.dumps(out))
"""


# ---------------------------------------------------------------- checks


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


def _requested_gpus(ctx: Context) -> tuple[Optional[int], str]:
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


def _visible_list(ctx: Context) -> tuple[Optional[list[str]], str]:
    e = ctx.environ
    for name in ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"):
        if name in e:
            value = e[name].strip()
            return ([] if value in ("", "-1", "NoDevFiles") else value.split(",")), name
    return None, ""


def check_gpus(ctx: Context) -> Check:
    requested, req_src = _requested_gpus(ctx)
    visible_env, vis_src = _visible_list(ctx)
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
            return Check("gpus", "fail", f"{requested} GPU(s) requested ({req_src}) but {rank_txt}none visible{where}",
                         "check the container passes GPUs (apptainer --nv/--rocm, docker --gpus all) and "
                         "that CUDA_VISIBLE_DEVICES is not emptied")
        return Check("gpus", "warn", f"no GPU visible{where}: gloo on CPU only", None)
    detail = f"{rank_txt}{count} GPU(s) visible{where}"
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
        return Check("stack", "warn", detail, "NGC containers expect 64 MiB (docker --ulimit stack=67108864, seed 000)")
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
    detail = f"{len(devices)} device(s) {','.join(devices)}; ACTIVE ports: {','.join(active) or 'none'}"
    if not uverbs:
        return Check("rdma", "fail", detail + "; /dev/infiniband/uverbs* missing",
                     "the container cannot open the HCAs: docker --device=/dev/infiniband, Kubernetes rdma/rdma "
                     "resource (RunAI --extended-resource rdma/rdma=1)")
    if not active:
        return Check("rdma", "fail", detail, "no port is ACTIVE: check cables/subnet manager (ibstat)")
    return Check("rdma", "pass", detail + f"; {len(uverbs)} uverbs device(s)")


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
    for name in ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"):
        if e.get(name, "").isdigit():
            return int(e[name])
    return None


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
    present = [c for c in ("srun", "scontrol", "sbatch") if ctx.runner.which(c)]
    if not present:
        return Check("slurm", "skip", "no Slurm client (srun/scontrol/sbatch) on PATH")
    missing = [c for c in ("srun", "scontrol", "sbatch") if c not in present]
    conf = ctx.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf"
    if not ctx.path(conf).exists() and "SLURM_JOB_ID" not in ctx.environ:
        return Check("slurm", "warn", f"{','.join(present)} installed but {conf} does not exist: no cluster configured here",
                     "on a cluster login node, set SLURM_CONF or load the site's slurm module")
    if "scontrol" not in present:
        return Check("slurm", "warn", f"found {','.join(present)} but not {','.join(missing)}")
    try:
        done = ctx.runner.run(["scontrol", "ping"], check=False, timeout=15)
    except CommandError as e:
        return Check("slurm", "fail", f"scontrol ping: {e.message}", "is SLURM_CONF right and the controller up?")
    out = (done.stdout + done.stderr).strip().replace("\n", "; ")
    if done.returncode != 0 or "UP" not in out:
        return Check("slurm", "fail", f"scontrol ping: {out or 'exit ' + str(done.returncode)}",
                     "the controller does not answer: check SLURM_CONF and munge")
    detail = f"{', '.join(present)} on PATH; {out}"
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
    n_opt, source = _tasks_per_node(e)
    torchrun = "TORCHELASTIC_RUN_ID" in e or "TORCHELASTIC_RESTART_COUNT" in e
    if n_opt is None:
        return Check("geometry", "skip", "not a Slurm job step (no SLURM_*TASKS_PER_NODE)")
    n = n_opt
    if torchrun and n != 1:
        return Check("geometry", "fail",
                     f"torchrun runs under {source}={n}: {n} torchrun copies per node each start "
                     f"LOCAL_WORLD_SIZE={e.get('LOCAL_WORLD_SIZE', '?')} workers",
                     "torchrun is one task per node: --ntasks-per-node=1 (torchhpc --launcher torchrun sets it)")
    if torchrun:
        return Check("geometry", "pass", f"torchrun, one task per node, LOCAL_WORLD_SIZE={e.get('LOCAL_WORLD_SIZE', '?')}")
    requested, _ = _requested_gpus(ctx)
    world, ntasks = e.get("WORLD_SIZE"), e.get("SLURM_NTASKS")
    if world and ntasks and world != ntasks:
        return Check("geometry", "fail", f"WORLD_SIZE={world} but SLURM_NTASKS={ntasks}",
                     "with srun/mpirun one task is one rank: drop the hand-set WORLD_SIZE or fix --ntasks")
    if requested and n != requested:
        return Check("geometry", "warn", f"{n} tasks per node for {requested} GPUs per node",
                     "with srun launching ranks directly, use one task per GPU (--ntasks-per-node = GPUs per node)")
    return Check("geometry", "pass", f"{n} task(s) per node ({source})" + (f", {requested} GPU(s) per node" if requested else ""))


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
            "(seed 001's constraints file)")
    if venv:
        return Check("pip-torch", "warn",
                     f"torch {version} comes from outside the venv ({location}); a pip install that needs "
                     "another torch version would put a second torch into the venv", hint)
    if custom:
        return Check("pip-torch", "warn", f"torch {version} is a custom build (a base image's): pip may replace it", hint)
    return Check("pip-torch", "pass", f"torch {version} from {location}; no venv in between")


CHECKS: tuple[tuple[str, Callable[[Context], Check]], ...] = (
    ("python", check_python),
    ("torch", check_torch),
    ("gpus", check_gpus),
    ("/dev/shm", check_shm),
    ("memlock", check_memlock),
    ("stack", check_stack),
    ("rdma", check_rdma),
    ("interface", check_interface),
    ("port", check_port),
    ("slurm", check_slurm),
    ("containers", check_containers),
    ("geometry", check_geometry),
    ("pip-torch", check_pip_torch),
)


def run_checks(ctx: Context, only: list[str] | None = None, skip_torch: bool = False) -> list[Check]:
    """Run every check (or ``only`` those); an unexpected exception becomes that check's ``fail``."""
    if skip_torch:
        ctx._torch = {"error": "skipped (--no-torch)"}
    results = []
    for name, fn in CHECKS:
        if only and name not in only:
            continue
        try:
            results.append(fn(ctx))
        except Exception as e:  # a doctor must report, not crash
            results.append(Check(name, "fail", f"check crashed: {type(e).__name__}: {e}", "please report this"))
    return results


def to_json(results: list[Check], ctx: Context) -> str:
    return json.dumps(
        {"in_job": ctx.in_job, "checks": [asdict(c) for c in results],
         "ok": not any(c.status == "fail" for c in results)},
        indent=2,
    )
