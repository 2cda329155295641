"""What ``up`` puts in place before any daemon starts: the packages, the state directory, the files.

Kept apart from :mod:`torchhpc.devcluster.bringup`, which starts the daemons and
waits for each: everything here is done once, before the first one, and none of
it needs a daemon running. The Debian packages that are missing (and only those),
the runtime directories emptied and made again, and the files the daemons and the
client wrappers read (slurm.conf, slurmdbd.conf, hosts, resolv.conf, the munge
key, the ``bin/`` wrappers that enter the controller's namespace), with the first
job id that follows the last cluster's.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
from collections.abc import Callable
from contextlib import suppress

import torchhpc.devcluster.config as config
import torchhpc.devcluster.netns as netns
from torchhpc.core.proc import Runner
from torchhpc.devcluster.config import CONTROLLER, LOGIN, Layout, shm_root
from torchhpc.devcluster.state import ClusterState
from torchhpc.errors import DevClusterError

__all__ = ["NEXT_JOB_ID", "RUNTIME_DIRS", "binds", "ensure_packages", "host_netns", "next_job_id", "prepare_dirs", "which", "write_files"]

# Subdirectories `up` creates; all but log/ go at `down`.
RUNTIME_DIRS = ("etc", "run", "spool", "state", "tmp", "munge", "mysql", "bin", "login", "log")

# program -> Debian package that provides it.
PACKAGES: dict[str, str] = {
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "sinfo": "slurm-client",
    "munged": "munge",
    "mpirun": "openmpi-bin",
    "dnsmasq": "dnsmasq-base",
}
ACCOUNTING_PACKAGES: dict[str, str] = {"slurmdbd": "slurmdbd", "mariadbd": "mariadb-server"}
# file (glob) -> package: Slurm's mpi/pmix plugin dlopen()s the unversioned
# libpmix.so that only the -dev package ships; without it `srun --mpi=pmix` fails.
FILE_PACKAGES: dict[str, str] = {"/usr/lib/*/pmix2/lib/libpmix.so": "libpmix-dev"}


def ensure_packages(
    accounting: bool, runner: Runner, progress: Callable[[str], None], login: bool = False
) -> list[str]:
    """Install the Debian packages that are missing (only those); returns what was installed."""
    wanted = dict(PACKAGES)
    if accounting:
        wanted.update(ACCOUNTING_PACKAGES)
    if login:
        from torchhpc.devcluster.login import LOGIN_PACKAGES

        wanted.update(LOGIN_PACKAGES)
    absent = {pkg for prog, pkg in wanted.items() if which(prog) is None}
    absent |= {pkg for pattern, pkg in FILE_PACKAGES.items() if not glob.glob(pattern)}
    missing = sorted(absent)
    if not missing:
        return []
    if which("apt-get") is None:
        raise DevClusterError(
            f"missing packages {', '.join(missing)} and no apt-get to install them",
            "install Slurm (slurmctld, slurmd, client), munge, OpenMPI and dnsmasq with your package manager",
        )
    progress(f"installing {' '.join(missing)} (apt-get)")
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    argv = ["apt-get", "install", "-y", "--no-install-recommends", *missing]
    done = runner.run(argv, check=False, env=env, timeout=900)
    if done.returncode != 0:
        progress("apt-get install failed; running apt-get update and retrying")
        runner.run(["apt-get", "update"], env=env, timeout=600)
        runner.run(argv, env=env, timeout=900, hint="install the packages by hand and retry")
    return missing


def which(program: str) -> str | None:
    """``program``'s path, also in the sbin directories (the daemons live there), or None."""
    # /usr/sbin is not on every root PATH (e.g. `sudo` on some systems).
    path = os.environ.get("PATH", os.defpath) + ":/usr/sbin:/sbin:/usr/bin:/bin"
    return shutil.which(program, path=path)


def host_netns() -> str:
    return os.readlink("/proc/self/ns/net")


def host_memory_mb() -> int | None:
    """This machine's MemTotal in MiB (what all the nodes share), None when /proc/meminfo is unreadable."""
    with suppress(OSError, ValueError, IndexError), open("/proc/meminfo") as f:
        return next((int(line.split()[1]) // 1024 for line in f if line.startswith("MemTotal:")), None)
    return None


def _real_memory_mb() -> int:
    host = host_memory_mb()
    return 4096 if host is None else max(1024, host - 512)


def prepare_dirs(layout: Layout) -> None:
    os.makedirs(layout.state_dir, mode=0o755, exist_ok=True)
    # log/ survives `down` for post-mortems but starts empty on every `up`, so
    # nothing waits on a line an earlier run wrote.
    for d in RUNTIME_DIRS:
        path = layout.path(d)
        if os.path.isdir(path):
            shutil.rmtree(path)
        os.makedirs(path, mode=0o755, exist_ok=True)
    shutil.rmtree(shm_root(layout.state_dir), ignore_errors=True)
    for name in layout.nodes:
        os.makedirs(layout.path("tmp", name), exist_ok=True)
        os.makedirs(layout.shm_dir(name), exist_ok=True)
        os.chmod(layout.shm_dir(name), 0o1777)  # as /dev/shm: every user's, each one's own files
        os.makedirs(layout.path("spool", f"slurmd-{name}"), exist_ok=True)
    os.makedirs(layout.path("state", "slurmctld"), exist_ok=True)
    for d in RUNTIME_DIRS:
        os.chmod(layout.path(d), 0o755)


def _write(path: str, text: str, mode: int = 0o644) -> None:
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, mode)


NEXT_JOB_ID = "next-job-id"  # in the state directory; kept by `down`
_JOB_ID = re.compile(rb"JobId=(\d+)")


def next_job_id(state_dir: str) -> int:
    """The first job id for a new cluster here: past every id the last cluster gave (its
    slurmctld.log survives ``down``) and past the number saved by the cluster before it."""
    saved = 1
    with suppress(OSError, ValueError), open(os.path.join(state_dir, NEXT_JOB_ID)) as f:
        saved = max(1, int(f.read().strip() or 1))
    try:
        with open(os.path.join(state_dir, "log", "slurmctld.log"), "rb") as f:
            seen = max((int(m) for m in _JOB_ID.findall(f.read())), default=0)
    except OSError:
        seen = 0
    return max(saved, seen + 1)


def write_files(layout: Layout, state: ClusterState, accounting: bool, first_job_id: int = 1) -> None:
    p = layout.path
    _write(
        layout.slurm_conf,
        config.render_slurm_conf(layout, accounting=accounting, real_memory_mb=_real_memory_mb(),
                                 first_job_id=first_job_id, cpus_per_node=state.cpus_per_node,
                                 min_job_age=state.min_job_age),
    )
    _write(os.path.join(layout.state_dir, NEXT_JOB_ID), f"{first_job_id}\n")
    if accounting:
        # slurmdbd refuses a config readable by others (it may hold a password).
        _write(layout.slurmdbd_conf, config.render_slurmdbd_conf(layout), 0o600)
    _write(p("etc", "hosts"), config.render_hosts(layout))
    _write(p("etc", "dns-hosts"), config.render_dns_hosts(layout))
    _write(p("etc", "resolv.conf"), config.render_resolv_conf(layout))
    for host in (CONTROLLER, *layout.nodes, *([LOGIN] if layout.login else [])):
        _write(p("etc", f"hostname.{host}"), host + "\n")
    key = p("munge", "munge.key")
    with open(os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o400), "wb") as f:
        f.write(os.urandom(1024))
    ctl_path = netns.netns_path(layout.controller_netns)
    for program in config.CLIENT_PROGRAMS:
        real = which(program)
        if real is not None:
            wrapper = config.render_client_wrapper(
                program, real, state.host_netns, ctl_path, binds(layout, None)
            )
            _write(os.path.join(layout.bin_dir, program), wrapper, 0o755)


def binds(layout: Layout, host: str | None) -> dict[str, str]:
    """Files bind-mounted over /etc in a daemon's private mount namespace, and a node's own /dev/shm."""
    binds = {layout.path("etc", "hosts"): "/etc/hosts", layout.path("etc", "resolv.conf"): "/etc/resolv.conf"}
    if host:
        binds[layout.path("etc", f"hostname.{host}")] = "/etc/hostname"
    if host in layout.nodes:
        binds[layout.shm_dir(host)] = "/dev/shm"
    return binds
