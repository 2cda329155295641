"""The steps of ``up``: packages, files, daemons in order, each waited for.

Order matters: munged before anything that authenticates; MariaDB and
slurmdbd before slurmctld (it exits without TRES from the database when
accounting is configured); slurmctld before the slurmds so they register at
once. Each wait fails early, naming the log, when the daemon dies.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import shutil
import time
from collections.abc import Callable, Sequence

import torchhpc.devcluster.config as config
import torchhpc.devcluster.daemons as daemons
import torchhpc.devcluster.netns as netns
from torchhpc.core.proc import Runner
from torchhpc.devcluster.config import CONTROLLER, LOGIN, Layout
from torchhpc.devcluster.daemons import Daemon
from torchhpc.devcluster.state import UP_HINT, ClusterState
from torchhpc.errors import CommandError, DevClusterError

__all__ = ["Client", "ensure_packages", "prepare_dirs", "start_all", "write_files"]

# A throw-away accounting database: durability buys nothing, start-up time does.
MARIADB_FAST = (
    "--innodb-buffer-pool-size=32M",
    "--innodb-log-file-size=8M",
    "--innodb-flush-method=nosync",
    "--innodb-doublewrite=0",
    "--innodb-flush-log-at-trx-commit=0",
)

# Kept across up/down (see _mariadb_template); never wiped by `up`.
CACHE_DIR = "cache"
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


def host_netns() -> str:
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


def prepare_dirs(layout: Layout) -> None:
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


NEXT_JOB_ID = "next-job-id"  # in the state directory; kept by `down`
_JOB_ID = re.compile(rb"JobId=(\d+)")


def next_job_id(state_dir: str) -> int:
    """The first job id for a new cluster here: past every id the last cluster gave (its
    slurmctld.log survives ``down``) and past the number saved by the cluster before it."""
    saved = 1
    try:
        with open(os.path.join(state_dir, NEXT_JOB_ID)) as f:
            saved = max(1, int(f.read().strip() or 1))
    except (OSError, ValueError):
        pass
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
        real = _which(program)
        if real is not None:
            wrapper = config.render_client_wrapper(
                program, real, state.host_netns, ctl_path, binds(layout, None)
            )
            _write(os.path.join(layout.bin_dir, program), wrapper, 0o755)


def binds(layout: Layout, host: str | None) -> dict[str, str]:
    """Files bind-mounted over /etc in a daemon's private mount namespace."""
    binds = {layout.path("etc", "hosts"): "/etc/hosts", layout.path("etc", "resolv.conf"): "/etc/resolv.conf"}
    if host:
        binds[layout.path("etc", f"hostname.{host}")] = "/etc/hostname"
    return binds


def _start(
    state: ClusterState, name: str, argv: list[str], ns: str | None, host: str | None, env: dict[str, str]
) -> Daemon:
    layout = state._layout()
    full = netns.in_namespace(ns, host, binds(layout, host), argv) if ns else argv
    d = daemons.start(name, full, layout.path("log", f"{name}.out"), netns=ns, env=env)
    state.daemons.append(d)
    state.save()
    return d


def restart_slurmd(state: ClusterState, node: str) -> Daemon:
    """Start ``node``'s slurmd again (``devcluster revive``), replacing its record in the state file."""
    env = dict(os.environ)
    env["SLURM_CONF"] = state.slurm_conf
    name = f"slurmd-{node}"
    state.daemons = [d for d in state.daemons if d.name != name]
    return _start(state, name, [_real("slurmd"), "-D", "-N", node], state.netns(node), node, env)


def _mariadb_template(layout: Layout, runner: Runner, timeout: float) -> str:
    """An empty, initialised MariaDB datadir, made once and copied on every ``up``.

    ``mariadb-install-db`` bootstraps a server and runs its SQL scripts: 0.6 s
    on a quiet machine, several seconds on a busy one, where copying the 26 MB
    result takes 0.1 s. The cache lives in the state dir (``down`` keeps it)
    and is keyed by the server binary and our settings, so an upgrade makes a
    new one.
    """
    server = _real("mariadbd")
    st = os.stat(server)
    key = hashlib.sha1(f"{server}:{st.st_size}:{st.st_mtime_ns}:{MARIADB_FAST}".encode()).hexdigest()[:12]
    template = layout.path(CACHE_DIR, f"mariadb-{key}")
    if os.path.isdir(template):
        return template
    tmp = template + f".tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(os.path.dirname(template), exist_ok=True)
    runner.run(
        [
            _real("mariadb-install-db"), "--no-defaults", f"--datadir={tmp}", "--user=root",
            "--auth-root-authentication-method=normal", "--skip-test-db", "--skip-name-resolve",
            *MARIADB_FAST,
        ],
        timeout=timeout, hint="mariadb-install-db failed: is mariadb-server installed?",
    )  # fmt: skip
    os.rename(tmp, template)
    return template


def start_all(
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
        shutil.copytree(_mariadb_template(layout, runner, timeout), datadir, symlinks=True)
        mysql_log = p("log", "mariadb.log")
        db = _start(
            state,
            "mariadbd",
            [
                _real("mariadbd"), "--no-defaults", f"--datadir={datadir}", f"--socket={layout.mysql_socket}",
                f"--pid-file={p('run', 'mariadbd.pid')}", "--bind-address=127.0.0.1",
                f"--port={config.MYSQL_PORT}", "--user=root", "--skip-name-resolve", "--skip-grant-tables",
                f"--log-error={mysql_log}", "--skip-log-bin", *MARIADB_FAST,
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
    # Jobs resolve node names through dnsmasq; it has long started by now, but check.
    daemons.wait_for("dnsmasq to listen on port 53", lambda: daemons.listening(dns.pid, 53), timeout, [dns])
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


def start_login(
    layout: Layout, state: ClusterState, users: Sequence[str], runner: Runner, progress: Callable[[str], None],
    timeout: float,
) -> None:
    """The login node (``up --login``): keys, one authorized_keys file per user, sshd in its namespace."""
    import torchhpc.devcluster.login as login

    for user in users:
        login.ensure_user(user, runner, progress)
    login.write_keys(layout, runner)
    login.authorize(layout, users)
    login.write_configs(layout, users)
    env = dict(os.environ)
    sshd = _start(state, "sshd", login.sshd_argv(layout, _real("sshd")), layout.login_netns, LOGIN, env)
    daemons.wait_for(
        f"sshd to listen on port {login.SSH_PORT}", lambda: daemons.listening(sshd.pid, login.SSH_PORT), timeout, [sshd]
    )
    if state.accounting:  # limits are enforced (AccountingStorageEnforce): a user needs an association to submit
        client = Client(state, runner)
        for user in users:
            if user != "root":  # slurmdbd gives root its association itself
                client.run("sacctmgr", "-i", "add", "user", user, "account=root", timeout=30, check=False)
    progress(f"login node up: ssh {login.host_alias(layout)} (users {', '.join(users)})")


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
        return {name: info["state"] for name, info in self.node_info().items()}

    def node_info(self) -> dict[str, dict[str, str]]:
        """``{node: {"state", "cpus", "memory_mb"}}`` as slurmctld sees them (sinfo, one line per node)."""
        out = self.run("sinfo", "-h", "-N", "-o", "%N %T %c %m", timeout=5, check=False)
        info: dict[str, dict[str, str]] = {}
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 4:
                info[parts[0]] = {"state": parts[1].lower(), "cpus": parts[2], "memory_mb": parts[3]}
        return info

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
