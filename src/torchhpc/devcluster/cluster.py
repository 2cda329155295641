"""Bring the dev cluster up and down, and describe the one that is up.

Everything lives under one state directory; ``state.json`` there records the
namespaces, addresses and the PIDs (with start times) of every daemon we
started, so ``down`` stops exactly those and nothing else.
"""

from __future__ import annotations

import glob
import json
import os
import platform
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from torchhpc.core.proc import Runner
from torchhpc.devcluster import config, daemons, netns
from torchhpc.devcluster.config import CONTROLLER, Layout
from torchhpc.devcluster.daemons import Daemon
from torchhpc.errors import CommandError, DevClusterError

__all__ = ["ClusterState", "default_state_dir", "down", "load_state", "read_state", "status", "up"]

STATE_FILE = "state.json"
ENV_STATE_DIR = "TORCHHPC_DEVCLUSTER_DIR"
# Subdirectories `up` creates and `down` removes; log/ survives a down for post-mortems.
RUNTIME_DIRS = ("etc", "run", "spool", "state", "tmp", "munge", "mysql", "bin", "log")
DOWN_REMOVES = tuple(d for d in RUNTIME_DIRS if d != "log")

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
DOWN_HINT = "torchhpc devcluster down"
UP_HINT = "torchhpc devcluster up --nodes 3 --accounting"


def default_state_dir(state_dir: str | None = None) -> str:
    """Explicit argument > $TORCHHPC_DEVCLUSTER_DIR > /var/tmp/torchhpc-devcluster."""
    return os.path.abspath(state_dir or os.environ.get(ENV_STATE_DIR) or config.DEFAULT_STATE_DIR)


@dataclass
class ClusterState:
    """What ``state.json`` records about a running dev cluster."""

    state_dir: str
    nodes: list[str]
    node_ips: dict[str, str]
    netns_names: dict[str, str]  # node name (and "ctl") -> network namespace
    controller_ip: str
    subnet: str
    slurm_conf: str
    munge_socket: str
    bin_dir: str
    host_netns: str
    accounting: bool
    daemons: list[Daemon] = field(default_factory=list)
    up_seconds: float = 0.0
    started_at: float = 0.0

    controller: str = CONTROLLER

    def node_ip(self, name: str) -> str:
        """IPv4 address of a node (or of ``ctl``), as the other nodes reach it."""
        if name == self.controller:
            return self.controller_ip
        try:
            return self.node_ips[name]
        except KeyError:
            raise DevClusterError(
                f"{name!r} is not a node of the dev cluster at {self.state_dir}",
                f"nodes are {', '.join(self.nodes)}",
            ) from None

    def netns(self, name: str) -> str:
        """Network namespace name of a node (or of ``ctl``)."""
        try:
            return self.netns_names[name]
        except KeyError:
            raise DevClusterError(
                f"{name!r} is not a node of the dev cluster at {self.state_dir}",
                f"use one of {', '.join([self.controller, *self.nodes])}",
            ) from None

    def client_env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """Environment for Slurm clients (sbatch, srun, sacct, ...) and what they submit.

        A copy of ``os.environ`` (or ``base``) with ``SLURM_CONF``, the OpenMPI
        settings for root over TCP, and the wrapper directory first on ``PATH``:
        the wrappers enter the controller's network namespace from the host, so a
        plain ``sbatch`` works. sbatch exports this environment into the job.
        """
        env = dict(os.environ if base is None else base)
        parts = [p for p in env.get("PATH", os.defpath).split(os.pathsep) if p and p != self.bin_dir]
        env["PATH"] = os.pathsep.join([self.bin_dir, *parts])
        env["SLURM_CONF"] = self.slurm_conf
        env.update(config.ompi_env(self._layout()))
        return env

    def _layout(self) -> Layout:
        return Layout(
            state_dir=self.state_dir,
            nodes=tuple(self.nodes),
            node_ips=tuple(self.node_ips[n] for n in self.nodes),
            controller_ip=self.controller_ip,
            prefix_len=int(self.subnet.split("/")[1]),
            netns_prefix=config.netns_prefix_for(self.state_dir),
        )

    def healthy(self) -> bool:
        """Every recorded daemon still runs and every namespace still exists."""
        return (
            bool(self.daemons)
            and all(daemons.alive(d) for d in self.daemons)
            and all(os.path.exists(netns.netns_path(ns)) for ns in self.netns_names.values())
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "version": 1,
            "state_dir": self.state_dir,
            "nodes": [{"name": n, "ip": self.node_ips[n], "netns": self.netns_names[n]} for n in self.nodes],
            "controller": {
                "name": self.controller,
                "ip": self.controller_ip,
                "netns": self.netns_names[self.controller],
            },
            "subnet": self.subnet,
            "slurm_conf": self.slurm_conf,
            "munge_socket": self.munge_socket,
            "bin_dir": self.bin_dir,
            "host_netns": self.host_netns,
            "accounting": self.accounting,
            "daemons": [d.to_json() for d in self.daemons],
            "up_seconds": self.up_seconds,
            "started_at": self.started_at,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ClusterState:
        nodes = [n["name"] for n in d["nodes"]]
        ns = {n["name"]: n["netns"] for n in d["nodes"]}
        ns[d["controller"]["name"]] = d["controller"]["netns"]
        return cls(
            state_dir=d["state_dir"],
            nodes=nodes,
            node_ips={n["name"]: n["ip"] for n in d["nodes"]},
            netns_names=ns,
            controller_ip=d["controller"]["ip"],
            subnet=d["subnet"],
            slurm_conf=d["slurm_conf"],
            munge_socket=d["munge_socket"],
            bin_dir=d["bin_dir"],
            host_netns=d["host_netns"],
            accounting=bool(d["accounting"]),
            daemons=[Daemon.from_json(x) for x in d.get("daemons", [])],
            up_seconds=float(d.get("up_seconds", 0.0)),
            started_at=float(d.get("started_at", 0.0)),
            controller=d["controller"]["name"],
        )

    def save(self) -> None:
        path = os.path.join(self.state_dir, STATE_FILE)
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.to_json(), f, indent=2)
            f.write("\n")
        os.replace(tmp, path)


def read_state(state_dir: str | None = None) -> ClusterState | None:
    """The recorded state, healthy or not (None when there is no state.json)."""
    path = os.path.join(default_state_dir(state_dir), STATE_FILE)
    try:
        with open(path) as f:
            return ClusterState.from_json(json.load(f))
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as e:
        raise DevClusterError(f"{path} is not a dev cluster state file ({e})", f"run `{DOWN_HINT}`") from None


def load_state(state_dir: str | None = None) -> ClusterState | None:
    """The running dev cluster, or None when none is up (or it is no longer healthy)."""
    try:
        state = read_state(state_dir)
    except DevClusterError:
        return None
    if state is None or not state.healthy():
        return None
    return state


# ---------------------------------------------------------------- checks


def check_host() -> None:
    """Linux and root: namespaces, bind mounts and daemons as SlurmUser=root need both."""
    if platform.system() != "Linux":
        raise DevClusterError(
            f"the dev cluster needs Linux network namespaces; this is {platform.system()}",
            "run it on a Linux machine or VM",
        )
    if os.geteuid() != 0:
        raise DevClusterError(
            f"the dev cluster must run as root (uid is {os.geteuid()}): it creates network namespaces",
            "run it with sudo, or as root in a VM/container",
        )


def ensure_packages(accounting: bool, runner: Runner, progress: Callable[[str], None]) -> list[str]:
    """Install the Debian packages that are missing (only those); returns what was installed."""
    wanted = dict(PACKAGES)
    if accounting:
        wanted.update(ACCOUNTING_PACKAGES)
    absent = {pkg for prog, pkg in wanted.items() if _which(prog) is None}
    absent |= {pkg for pattern, pkg in FILE_PACKAGES.items() if not glob.glob(pattern)}
    missing = sorted(absent)
    if not missing:
        return []
    if _which("apt-get") is None:
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


def _which(program: str) -> str | None:
    # /usr/sbin is not on every root PATH (e.g. `sudo` on some systems).
    path = os.environ.get("PATH", os.defpath) + ":/usr/sbin:/sbin:/usr/bin:/bin"
    return shutil.which(program, path=path)


def _real(program: str) -> str:
    found = _which(program)
    if found is None:
        raise DevClusterError(f"{program} is not installed", f"install it, or run `{UP_HINT}` as root")
    return found


def _host_netns() -> str:
    return os.readlink("/proc/self/ns/net")


def _real_memory_mb() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return max(1024, int(line.split()[1]) // 1024 - 512)
    except OSError:
        pass
    return 4096


# ---------------------------------------------------------------- up


def up(
    nodes: int = 3,
    accounting: bool = False,
    state_dir: str | None = None,
    progress: Callable[[str], None] | None = print,
    runner: Runner | None = None,
    timeout: float = 120.0,
) -> ClusterState:
    """Bring up a real multi-node Slurm cluster in network namespaces; returns its state.

    Raises :class:`DevClusterError` when not root/Linux, when a cluster is
    already up in ``state_dir``, or when a daemon fails to start (then
    everything started so far is stopped again and the logs are kept).
    """
    check_host()
    say: Callable[[str], None] = progress or (lambda _m: None)
    runner = runner or Runner()
    sdir = default_state_dir(state_dir)
    layout = config.make_layout(sdir, nodes)
    previous = read_state(sdir)
    if previous is not None:
        if previous.healthy():
            raise DevClusterError(
                f"a dev cluster is already up in {sdir} ({len(previous.nodes)} nodes)",
                f"use it, or run `{DOWN_HINT}` first",
            )
        if any(daemons.alive(d) for d in previous.daemons):
            raise DevClusterError(
                f"a dev cluster in {sdir} is partly running (some daemons died)",
                f"run `{DOWN_HINT}` to clean it up",
            )
    leftovers = netns.existing(layout.netns_prefix, runner)
    if leftovers and previous is None:
        raise DevClusterError(
            f"network namespaces {', '.join(leftovers)} exist but {sdir} records no cluster",
            f"run `{DOWN_HINT}` (it removes them) or `ip netns delete NAME`",
        )
    if previous is not None:
        down(sdir, runner=runner, progress=lambda _m: None)

    t0 = time.monotonic()
    installed = ensure_packages(accounting, runner, say)
    t_ready = time.monotonic()
    if installed:
        say(f"installed {' '.join(installed)} in {t_ready - t0:.0f} s")

    _prepare_dirs(layout)

    def step(msg: str) -> None:  # every step says when it finished: bring-up timings for free
        say(f"{msg} (+{time.monotonic() - t_ready:.1f} s)")

    state = ClusterState(
        state_dir=sdir,
        nodes=list(layout.nodes),
        node_ips=dict(zip(layout.nodes, layout.node_ips)),
        netns_names={CONTROLLER: layout.controller_netns, **{n: layout.node_netns(n) for n in layout.nodes}},
        controller_ip=layout.controller_ip,
        subnet=layout.subnet,
        slurm_conf=layout.slurm_conf,
        munge_socket=layout.munge_socket,
        bin_dir=layout.bin_dir,
        host_netns=_host_netns(),
        accounting=accounting,
        started_at=time.time(),
    )
    try:
        _write_files(layout, state, accounting)
        step(f"network: {len(layout.nodes)} node namespaces + {layout.controller_netns} on {layout.subnet}")
        netns.create(layout, runner)
        state.save()
        _start_all(layout, state, accounting, runner, step, timeout)
    except BaseException:
        step("bring-up failed; stopping what was started (logs kept in " + layout.path("log") + ")")
        daemons.stop(list(reversed(state.daemons)))
        netns.delete(netns.existing(layout.netns_prefix, runner), runner)
        _remove_state_file(sdir)
        raise
    state.up_seconds = round(time.monotonic() - t_ready, 2)
    state.save()
    step(f"up: {len(layout.nodes)} nodes idle")
    return state


def _prepare_dirs(layout: Layout) -> None:
    os.makedirs(layout.state_dir, mode=0o755, exist_ok=True)
    # log/ survives `down` for post-mortems but starts empty on every `up`, so
    # nothing waits on a line an earlier run wrote.
    for d in RUNTIME_DIRS:
        path = layout.path(d)
        if os.path.isdir(path):
            shutil.rmtree(path)
        os.makedirs(path, mode=0o755, exist_ok=True)
    for name in layout.nodes:
        os.makedirs(layout.path("tmp", name), exist_ok=True)
        os.makedirs(layout.path("spool", f"slurmd-{name}"), exist_ok=True)
    os.makedirs(layout.path("state", "slurmctld"), exist_ok=True)
    for d in RUNTIME_DIRS:
        os.chmod(layout.path(d), 0o755)


def _write(path: str, text: str, mode: int = 0o644) -> None:
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, mode)


def _write_files(layout: Layout, state: ClusterState, accounting: bool) -> None:
    p = layout.path
    _write(
        layout.slurm_conf,
        config.render_slurm_conf(layout, accounting=accounting, real_memory_mb=_real_memory_mb()),
    )
    if accounting:
        # slurmdbd refuses a config readable by others (it may hold a password).
        _write(layout.slurmdbd_conf, config.render_slurmdbd_conf(layout), 0o600)
    _write(p("etc", "hosts"), config.render_hosts(layout))
    _write(p("etc", "dns-hosts"), config.render_dns_hosts(layout))
    _write(p("etc", "resolv.conf"), config.render_resolv_conf(layout))
    for host in (CONTROLLER, *layout.nodes):
        _write(p("etc", f"hostname.{host}"), host + "\n")
    key = p("munge", "munge.key")
    with open(os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o400), "wb") as f:
        f.write(os.urandom(1024))
    ctl_path = netns.netns_path(layout.controller_netns)
    for program in config.CLIENT_PROGRAMS:
        real = _which(program)
        if real is not None:
            wrapper = config.render_client_wrapper(
                program, real, state.host_netns, ctl_path, _binds(layout, None)
            )
            _write(os.path.join(layout.bin_dir, program), wrapper, 0o755)


def _binds(layout: Layout, host: str | None) -> dict[str, str]:
    """Files bind-mounted over /etc in a daemon's private mount namespace."""
    binds = {layout.path("etc", "hosts"): "/etc/hosts", layout.path("etc", "resolv.conf"): "/etc/resolv.conf"}
    if host:
        binds[layout.path("etc", f"hostname.{host}")] = "/etc/hostname"
    return binds


def _start(
    state: ClusterState, name: str, argv: list[str], ns: str | None, host: str | None, env: dict[str, str]
) -> Daemon:
    layout = state._layout()
    full = netns.in_namespace(ns, host, _binds(layout, host), argv) if ns else argv
    d = daemons.start(name, full, layout.path("log", f"{name}.out"), netns=ns, env=env)
    state.daemons.append(d)
    state.save()
    return d


def _start_all(
    layout: Layout,
    state: ClusterState,
    accounting: bool,
    runner: Runner,
    progress: Callable[[str], None],
    timeout: float,
) -> None:
    p = layout.path
    env = dict(os.environ)
    env["SLURM_CONF"] = layout.slurm_conf
    ctl = layout.controller_netns

    munged = _start(
        state,
        "munged",
        [
            _real("munged"), "-F", "--force",
            f"--socket={layout.munge_socket}",
            f"--key-file={p('munge', 'munge.key')}",
            f"--pid-file={p('run', 'munged.pid')}",
            f"--seed-file={p('munge', 'munged.seed')}",
            f"--log-file={p('log', 'munged.log')}",
        ],
        None, None, env,
    )  # fmt: skip
    daemons.wait_for("munged's socket", lambda: os.path.exists(layout.munge_socket), 20, [munged])
    progress("munged up")

    dns = _start(
        state,
        "dnsmasq",
        [
            _real("dnsmasq"), "--keep-in-foreground", "--conf-file=/dev/null", "--no-resolv", "--no-hosts",
            f"--addn-hosts={p('etc', 'dns-hosts')}", f"--listen-address={layout.controller_ip}",
            "--bind-interfaces", "--local=/#/", "--user=root", f"--pid-file={p('run', 'dnsmasq.pid')}",
            f"--log-facility={p('log', 'dnsmasq.log')}",
        ],
        ctl, CONTROLLER, env,
    )  # fmt: skip

    if accounting:
        datadir = p("mysql", "data")
        runner.run(
            [
                _real("mariadb-install-db"), "--no-defaults", f"--datadir={datadir}", "--user=root",
                "--auth-root-authentication-method=normal", "--skip-test-db", "--skip-name-resolve",
            ],
            timeout=timeout, hint=f"see {p('log')}",
        )  # fmt: skip
        mysql_log = p("log", "mariadb.log")
        db = _start(
            state,
            "mariadbd",
            [
                _real("mariadbd"), "--no-defaults", f"--datadir={datadir}", f"--socket={layout.mysql_socket}",
                f"--pid-file={p('run', 'mariadbd.pid')}", "--bind-address=127.0.0.1",
                f"--port={config.MYSQL_PORT}", "--user=root", "--skip-name-resolve", "--skip-grant-tables",
                f"--log-error={mysql_log}", "--innodb-buffer-pool-size=64M", "--skip-log-bin",
            ],
            ctl, CONTROLLER, env,
        )  # fmt: skip
        daemons.wait_for(
            f"MariaDB to listen on port {config.MYSQL_PORT}",
            lambda: daemons.listening(db.pid, config.MYSQL_PORT),
            timeout,
            [db],
        )
        progress("MariaDB up")
        dbd = _start(state, "slurmdbd", [_real("slurmdbd"), "-D"], ctl, CONTROLLER, env)
        daemons.wait_for(
            f"slurmdbd to listen on port {config.SLURMDBD_PORT}",
            lambda: daemons.listening(dbd.pid, config.SLURMDBD_PORT),
            timeout,
            [dbd],
        )
        progress("slurmdbd up")

    ctld = _start(state, "slurmctld", [_real("slurmctld"), "-D", "-i"], ctl, CONTROLLER, env)
    client = Client(state, runner)
    daemons.wait_for("slurmctld", client.ping, timeout, [ctld, dns])
    progress("slurmctld up")
    if accounting:
        client.ensure_cluster_registered()
        progress("cluster registered in the accounting database")

    slurmds = [
        _start(
            state, f"slurmd-{name}", [_real("slurmd"), "-D", "-N", name], layout.node_netns(name), name, env
        )
        for name in layout.nodes
    ]
    daemons.wait_for(
        f"{len(layout.nodes)} nodes idle", lambda: client.all_idle(layout.nodes), timeout, [ctld, *slurmds]
    )


# ---------------------------------------------------------------- clients


class Client:
    """Slurm client calls made by `up`/`status` themselves, from inside the controller namespace."""

    def __init__(self, state: ClusterState, runner: Runner) -> None:
        self.state = state
        self.runner = runner
        self.env = state.client_env()

    def argv(self, program: str, *args: str) -> list[str]:
        return [
            "nsenter",
            f"--net={netns.netns_path(self.state.netns(CONTROLLER))}",
            "--",
            _real(program),
            *args,
        ]

    def run(self, program: str, *args: str, timeout: float = 10.0, check: bool = True) -> str:
        return self.runner.run(self.argv(program, *args), env=self.env, timeout=timeout, check=check).stdout

    def ping(self) -> bool:
        try:
            out = self.run("scontrol", "ping", timeout=5, check=False)
        except CommandError:
            return False
        return "is UP" in out

    def node_states(self) -> dict[str, str]:
        out = self.run("sinfo", "-h", "-N", "-o", "%N %T", timeout=5, check=False)
        states: dict[str, str] = {}
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 2:
                states[parts[0]] = parts[1].lower()
        return states

    def all_idle(self, names: Sequence[str]) -> bool:
        try:
            states = self.node_states()
        except CommandError:
            return False
        return all(states.get(n) == "idle" for n in names)

    def ensure_cluster_registered(self) -> None:
        """Make sure the cluster exists in the accounting database (sacct shows nothing otherwise)."""
        deadline = time.monotonic() + 30
        while True:
            try:
                out = self.run("sacctmgr", "-n", "-P", "list", "cluster", "format=cluster", timeout=10)
                if config.CLUSTER_NAME in out.split():
                    return
                self.run("sacctmgr", "-i", "add", "cluster", config.CLUSTER_NAME, timeout=10, check=False)
            except CommandError:
                pass
            if time.monotonic() > deadline:
                raise DevClusterError(
                    "the cluster did not appear in the accounting database",
                    f"see {self.state.state_dir}/log/slurmdbd.log",
                )
            time.sleep(0.2)


# ---------------------------------------------------------------- down / status


def _remove_state_file(sdir: str) -> None:
    try:
        os.remove(os.path.join(sdir, STATE_FILE))
    except FileNotFoundError:
        pass


def down(
    state_dir: str | None = None,
    runner: Runner | None = None,
    progress: Callable[[str], None] | None = print,
) -> list[str]:
    """Stop exactly the recorded daemons and delete the cluster's namespaces. Idempotent.

    Returns what was stopped or removed (empty when nothing was up).
    """
    check_host()
    runner = runner or Runner()
    sdir = default_state_dir(state_dir)
    state = read_state(sdir)
    done: list[str] = []
    names = set(netns.existing(config.netns_prefix_for(sdir), runner))
    if state is not None:
        names |= {ns for ns in state.netns_names.values() if os.path.exists(netns.netns_path(ns))}
        if state.healthy():
            _cancel_all_jobs(state, runner)
        # Reverse start order: slurmd before slurmctld before slurmdbd before MariaDB.
        done += daemons.stop(list(reversed(state.daemons)))
    # Job steps outlive a stopped slurmd; whatever still runs inside the
    # cluster's own namespaces was started by it and goes with it.
    leftover = netns.pids_in(sorted(names))
    if leftover:
        daemons.kill_pids(leftover)
        done.append(f"{len(leftover)} job processes")
    done += netns.delete(sorted(names), runner)
    _remove_state_file(sdir)
    for d in DOWN_REMOVES:
        path = os.path.join(sdir, d)
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
    (progress or (lambda _m: None))(
        f"down: stopped {len(done)} daemons/namespaces in {sdir}"
        if done
        else f"down: nothing running in {sdir}"
    )
    return done


def _cancel_all_jobs(state: ClusterState, runner: Runner, wait: float = 10.0) -> None:
    """scancel every job so steps end through Slurm (epilogs, accounting) before the daemons stop."""
    client = Client(state, runner)
    try:
        ids = client.run("squeue", "-h", "-o", "%i", timeout=10, check=False).split()
        if not ids:
            return
        client.run("scancel", *ids, timeout=10, check=False)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not client.run("squeue", "-h", "-o", "%i", timeout=10, check=False).split():
                return
            time.sleep(0.2)
    except CommandError:
        pass  # a dying controller: the process sweep below still cleans up


def status(state_dir: str | None = None, runner: Runner | None = None) -> dict[str, Any]:
    """A summary of the dev cluster: daemons alive, node states from sinfo, how to use it."""
    sdir = default_state_dir(state_dir)
    state = read_state(sdir)
    if state is None:
        return {"state_dir": sdir, "up": False, "healthy": False}
    info: dict[str, Any] = {
        "state_dir": sdir,
        "up": True,
        "healthy": state.healthy(),
        "accounting": state.accounting,
        "slurm_conf": state.slurm_conf,
        "controller": {"name": state.controller, "ip": state.controller_ip},
        "daemons": [{"name": d.name, "pid": d.pid, "alive": daemons.alive(d)} for d in state.daemons],
        "up_seconds": state.up_seconds,
    }
    node_states: dict[str, str] = {}
    if info["healthy"]:
        try:
            node_states = Client(state, runner or Runner()).node_states()
        except CommandError:
            pass
    info["nodes"] = [
        {
            "name": n,
            "ip": state.node_ips[n],
            "netns": state.netns_names[n],
            "state": node_states.get(n, "unknown"),
        }
        for n in state.nodes
    ]
    return info


def run_client(state: ClusterState, argv: Sequence[str]) -> int:
    """Run a command with the cluster's client env, output passed through (``devcluster exec``).

    Interactive pass-through is why this uses subprocess directly and not the
    capturing Runner.
    """
    try:
        return subprocess.call(list(argv), env=state.client_env())
    except FileNotFoundError:
        raise DevClusterError(f"{argv[0]}: command not found", "check the command after `--`") from None


def shell_argv(state: ClusterState, name: str, shell: str | None = None) -> list[str]:
    """argv for an interactive shell on a node: its network namespace, hostname and /etc files."""
    ns = state.netns(name)
    return netns.in_namespace(
        ns, name, _binds(state._layout(), name), [shell or os.environ.get("SHELL") or "/bin/bash"]
    )
