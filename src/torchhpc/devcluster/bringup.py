"""The daemons of ``up``, in order, each waited for, and the Slurm client calls ``up`` and ``status`` make.

Order matters: munged before anything that authenticates; MariaDB and
slurmdbd before slurmctld (it exits without TRES from the database when
accounting is configured); slurmctld before the slurmds so they register at
once. Each wait fails early, naming the log, when the daemon dies. The steps
before them (packages, directories, files) are :mod:`torchhpc.devcluster.prepare`'s.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from collections.abc import Callable, Sequence
from contextlib import suppress

import torchhpc.devcluster.config as config
import torchhpc.devcluster.daemons as daemons
import torchhpc.devcluster.netns as netns
from torchhpc.core.proc import Runner
from torchhpc.devcluster.config import CONTROLLER, LOGIN, Layout
from torchhpc.devcluster.daemons import Daemon
from torchhpc.devcluster.prepare import binds, which
from torchhpc.devcluster.state import UP_HINT, ClusterState
from torchhpc.errors import CommandError, DevClusterError

__all__ = ["Client", "restart_slurmd", "start_all", "start_login"]

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


def _real(program: str) -> str:
    found = which(program)
    if found is None:
        raise DevClusterError(f"{program} is not installed", f"install it, or run `{UP_HINT}` as root")
    return found


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


def _wait_listening(what: str, daemon: Daemon, port: int, timeout: float) -> None:
    daemons.wait_for(f"{what} to listen on port {port}", lambda: daemons.listening(daemon.pid, port), timeout,
                     [daemon])


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
        _wait_listening("MariaDB", db, config.MYSQL_PORT, timeout)
        progress("MariaDB up")
        dbd = _start(state, "slurmdbd", [_real("slurmdbd"), "-D"], ctl, CONTROLLER, env)
        _wait_listening("slurmdbd", dbd, config.SLURMDBD_PORT, timeout)
        progress("slurmdbd up")

    ctld = _start(state, "slurmctld", [_real("slurmctld"), "-D", "-i"], ctl, CONTROLLER, env)
    client = Client(state, runner)
    daemons.wait_for("slurmctld", client.ping, timeout, [ctld, dns])
    progress("slurmctld up")
    # Jobs resolve node names through dnsmasq; it has long started by now, but check.
    _wait_listening("dnsmasq", dns, 53, timeout)
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
    _wait_listening("sshd", sshd, login.SSH_PORT, timeout)
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

    def node_info(self) -> dict[str, dict[str, str]]:
        """``{node: {"state", "cpus", "memory_mb"}}`` as slurmctld sees them (sinfo, one line per node)."""
        out = self.run("sinfo", "-h", "-N", "-o", "%N %T %c %m", timeout=5, check=False)
        return {parts[0]: {"state": parts[1].lower(), "cpus": parts[2], "memory_mb": parts[3]}
                for line in out.splitlines() if len(parts := line.split()) == 4}

    def all_idle(self, names: Sequence[str]) -> bool:
        try:
            info = self.node_info()
        except CommandError:
            return False
        return all(info.get(n, {}).get("state") == "idle" for n in names)

    def ensure_cluster_registered(self) -> None:
        """Make sure the cluster exists in the accounting database (sacct shows nothing otherwise)."""
        deadline = time.monotonic() + 30
        while True:
            with suppress(CommandError):
                out = self.run("sacctmgr", "-n", "-P", "list", "cluster", "format=cluster", timeout=10)
                if config.CLUSTER_NAME in out.split():
                    return
                self.run("sacctmgr", "-i", "add", "cluster", config.CLUSTER_NAME, timeout=10, check=False)
            if time.monotonic() > deadline:
                raise DevClusterError(
                    "the cluster did not appear in the accounting database",
                    f"see {self.state.state_dir}/log/slurmdbd.log",
                )
            time.sleep(0.2)
