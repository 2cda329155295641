"""Pure rendering of everything the dev cluster writes: slurm.conf, slurmdbd.conf,
hosts, resolv.conf and the client wrappers.

Nothing here touches the machine, so unit tests can pin every line. The choices
come from what was verified on a Debian 12 sandbox (shared/README.md §2): the
host's cgroups are not ours, so no cgroup plugins; every node sees the same real
cores, so ``config_overrides`` lets us declare ``CPUs=4``; PMIx app dirs collide
on a shared /tmp, so each node gets its own ``TmpFS``.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass

from torchhpc.core.shell import join, quote
from torchhpc.errors import UsageError

__all__ = [
    "CLIENT_PROGRAMS",
    "CLUSTER_NAME",
    "CONTROLLER",
    "DEFAULT_STATE_DIR",
    "LOGIN",
    "PARTITION",
    "Layout",
    "make_layout",
    "ompi_env",
    "render_client_wrapper",
    "render_dns_hosts",
    "render_hosts",
    "render_resolv_conf",
    "render_slurm_conf",
    "render_slurmdbd_conf",
]

DEFAULT_STATE_DIR = "/var/tmp/torchhpc-devcluster"
CLUSTER_NAME = "torchhpc"
CONTROLLER = "ctl"
# The login node (``up --login``): an sshd in its own namespace, no slurmd.
LOGIN = "login"
PARTITION = "debug"
CPUS_PER_NODE = 4  # the default of `devcluster up --cpus-per-node`
MAX_CPUS_PER_NODE = 256
MAX_NODES = 64
# A private /24 that exists only inside the cluster's namespaces: the host's
# routing table never sees it, so it cannot clash with the machine's network.
DEFAULT_SUBNET = "10.77.0.0/24"
BRIDGE = "br0"
SLURMDBD_PORT = 6819
MYSQL_PORT = 3306

# Slurm client programs that need to reach the controller. From the host they
# run inside the controller's network namespace (through a wrapper on PATH);
# inside a job they are already in a node namespace and run directly.
CLIENT_PROGRAMS: tuple[str, ...] = (
    "sacct",
    "sacctmgr",
    "salloc",
    "sattach",
    "sbatch",
    "sbcast",
    "scancel",
    "scontrol",
    "sdiag",
    "sinfo",
    "sprio",
    "squeue",
    "sreport",
    "srun",
    "sshare",
    "sstat",
    "strigger",
)


@dataclass(frozen=True)
class Layout:
    """Names, addresses and paths of one dev cluster, derived from its state dir."""

    state_dir: str
    nodes: tuple[str, ...]
    node_ips: tuple[str, ...]
    controller_ip: str
    prefix_len: int
    netns_prefix: str
    login: bool = False

    @property
    def login_ip(self) -> str:
        """The login node's address: the subnet's fifth (.5 in a /24), below the nodes' .11 on."""
        return str(ipaddress.ip_address(self.controller_ip) + 4)

    @property
    def login_netns(self) -> str:
        return f"{self.netns_prefix}-{LOGIN}"

    @property
    def subnet(self) -> str:
        return str(ipaddress.ip_network(f"{self.controller_ip}/{self.prefix_len}", strict=False))

    @property
    def controller_netns(self) -> str:
        return f"{self.netns_prefix}-{CONTROLLER}"

    def node_netns(self, name: str) -> str:
        return f"{self.netns_prefix}-{name}"

    def path(self, *parts: str) -> str:
        return os.path.join(self.state_dir, *parts)

    def shm_dir(self, node: str) -> str:
        """``node``'s /dev/shm (bind-mounted in its namespace): a node's shared memory is its own, and a failed
        node's is gone with it (``devcluster fail``), as on real nodes."""
        return os.path.join(shm_root(self.state_dir), node)

    @property
    def slurm_conf(self) -> str:
        return self.path("etc", "slurm.conf")

    @property
    def slurmdbd_conf(self) -> str:
        # slurmdbd looks for slurmdbd.conf beside the slurm.conf named by SLURM_CONF.
        return self.path("etc", "slurmdbd.conf")

    @property
    def munge_socket(self) -> str:
        return self.path("munge", "munge.socket")

    @property
    def bin_dir(self) -> str:
        return self.path("bin")

    @property
    def mysql_socket(self) -> str:
        return self.path("mysql", "mysqld.sock")


def netns_prefix_for(state_dir: str) -> str:
    """``torchhpc`` for the default state dir, ``torchhpc-<hash>`` otherwise.

    Namespace names are global to the machine; hashing the state dir lets a
    throw-away cluster (a test's tmp dir) run beside the shared one.
    """
    if os.path.abspath(state_dir) == DEFAULT_STATE_DIR:
        return "torchhpc"
    import hashlib  # here: every Slurm command of the CLI reads the state; a named throw-away cluster is rare

    digest = hashlib.sha1(os.path.abspath(state_dir).encode()).hexdigest()[:6]
    return f"torchhpc-{digest}"


def shm_root(state_dir: str) -> str:
    """Where the cluster's nodes keep their own /dev/shm: in the machine's memory (tmpfs), a folder per cluster."""
    return f"/dev/shm/.{netns_prefix_for(state_dir)}-devcluster"


MIN_JOB_AGE = 300  # Slurm's default


def check_cpus_per_node(cpus: int) -> None:
    """``--cpus-per-node`` within what slurm.conf may declare here (one error line, no bring-up)."""
    if not 1 <= cpus <= MAX_CPUS_PER_NODE:
        raise UsageError(f"--cpus-per-node {cpus} is out of range",
                         f"declare 1 to {MAX_CPUS_PER_NODE} CPUs a node (default {CPUS_PER_NODE})")


def make_layout(state_dir: str, nodes: int, subnet: str = DEFAULT_SUBNET, login: bool = False) -> Layout:
    """Node names ``node1..nodeN``; the controller takes the subnet's first address."""
    if not 1 <= nodes <= MAX_NODES:
        raise UsageError(
            f"--nodes {nodes} is out of range", f"the dev cluster supports 1 to {MAX_NODES} nodes"
        )
    net = ipaddress.ip_network(subnet)
    hosts = list(net.hosts())
    if len(hosts) < nodes + 11:
        raise UsageError(f"subnet {subnet} is too small for {nodes} nodes", "use a /24")
    state_dir = os.path.abspath(state_dir)
    names = tuple(f"node{i}" for i in range(1, nodes + 1))
    ips = tuple(str(hosts[9 + i]) for i in range(1, nodes + 1))  # .11, .12, ...
    return Layout(
        state_dir=state_dir,
        nodes=names,
        node_ips=ips,
        controller_ip=str(hosts[0]),
        prefix_len=net.prefixlen,
        netns_prefix=netns_prefix_for(state_dir),
        login=login,
    )


def render_slurm_conf(layout: Layout, *, accounting: bool, real_memory_mb: int, first_job_id: int = 1,
                      cpus_per_node: int = CPUS_PER_NODE, min_job_age: int = MIN_JOB_AGE) -> str:
    """slurm.conf for the whole cluster (controller, nodes and clients read the same file).

    ``first_job_id``: job ids go on where the last cluster in this state directory stopped
    (``FirstJobId``), so a job directory ``<name>-<id>/`` of an earlier cluster is never hit again.
    ``cpus_per_node``: what each node declares; they all share the machine's cores anyway, so more
    only lets more jobs run at once (the test suite's cluster, where jobs must wait on the machine,
    never on a full queue).
    ``min_job_age``: seconds the controller remembers an ended job (``MinJobAge``); after that (and its
    purge, every 60 s) only ``sacct`` knows it. A short one ages a job into accounting within a test."""
    p = layout.path
    lines = [
        "# Written by `torchhpc devcluster up`; rewritten on every up.",
        f"ClusterName={CLUSTER_NAME}",
        f"SlurmctldHost={CONTROLLER}({layout.controller_ip})",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        # cred_expire: Slurm holds a requeued job this long (120 s by default) before it may run again;
        # a test cluster requeues often, so 30 s keeps the nothing-lost scenarios short.
        f"AuthInfo=socket={layout.munge_socket},cred_expire=30",
        f"StateSaveLocation={p('state', 'slurmctld')}",
        f"SlurmdSpoolDir={p('spool', 'slurmd-%n')}",
        f"SlurmctldPidFile={p('run', 'slurmctld.pid')}",
        f"SlurmdPidFile={p('run', 'slurmd-%n.pid')}",
        f"SlurmctldLogFile={p('log', 'slurmctld.log')}",
        f"SlurmdLogFile={p('log', 'slurmd-%n.log')}",
        # The host's cgroup tree belongs to the sandbox: track processes by /proc
        # and bind nothing.
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "SwitchType=switch/none",
        "MpiDefault=none",
        "SchedulerType=sched/backfill",
        # A pending job is looked at again within a second, not the default 60 s (main loop) / 30 s (backfill):
        # the suite's tests wait on scheduling, not on a timer (issue 53; Slurm's own backfill tests do the same).
        "SchedulerParameters=bf_interval=1,sched_interval=1",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        # Every node sees the machine's real cores; declare 4 per node anyway.
        "SlurmdParameters=config_overrides",
        "ReturnToService=2",
        "SlurmdTimeout=10",
        "SlurmctldTimeout=10",
        "InactiveLimit=0",
        "KillWait=5",
        f"MinJobAge={min_job_age}",
        "MessageTimeout=10",
        # PMIx keeps per-job app dirs under TmpFS; a shared /tmp makes nodes collide.
        f"TmpFS={p('tmp', '%n')}",
        "JobCompType=jobcomp/none",
    ]
    if first_job_id > 1:
        lines.append(f"FirstJobId={first_job_id}")
    if accounting:
        lines += [
            "AccountingStorageType=accounting_storage/slurmdbd",
            f"AccountingStorageHost={layout.controller_ip}",
            f"AccountingStoragePort={SLURMDBD_PORT}",
            # Accounting connections ignore AuthInfo; without this they retry the
            # default munge socket forever.
            f"AccountingStoragePass={layout.munge_socket}",
            # Limits set with sacctmgr (QOS MaxTRESPerUser, ...) hold jobs as on a real site. Every job
            # then needs an association: adding the cluster creates root's, and jobs here run as root.
            "AccountingStorageEnforce=associations,limits,qos",
        ]
    else:
        lines.append("AccountingStorageType=accounting_storage/none")
    for name, ip in zip(layout.nodes, layout.node_ips):
        lines.append(
            f"NodeName={name} NodeAddr={ip} NodeHostname={name} CPUs={cpus_per_node} "
            f"RealMemory={real_memory_mb} State=UNKNOWN"
        )
    lines.append(
        f"PartitionName={PARTITION} Nodes={','.join(layout.nodes)} Default=YES MaxTime=INFINITE State=UP"
    )
    return "\n".join(lines) + "\n"


def render_slurmdbd_conf(layout: Layout) -> str:
    """slurmdbd.conf: MariaDB on the controller namespace's own loopback."""
    p = layout.path
    lines = [
        "# Written by `torchhpc devcluster up --accounting`.",
        "AuthType=auth/munge",
        f"AuthInfo=socket={layout.munge_socket}",
        f"DbdHost={CONTROLLER}",
        f"DbdPort={SLURMDBD_PORT}",
        "SlurmUser=root",
        f"LogFile={p('log', 'slurmdbd.log')}",
        f"PidFile={p('run', 'slurmdbd.pid')}",
        "StorageType=accounting_storage/mysql",
        "StorageHost=127.0.0.1",
        f"StoragePort={MYSQL_PORT}",
        "StorageUser=root",
        "StorageLoc=slurm_acct_db",
    ]
    return "\n".join(lines) + "\n"


def render_hosts(layout: Layout) -> str:
    """/etc/hosts seen by every daemon and job of the cluster."""
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    lines += render_dns_hosts(layout).splitlines()
    return "\n".join(lines) + "\n"


def render_dns_hosts(layout: Layout) -> str:
    """The names dnsmasq serves (forward and reverse): the controller and the nodes."""
    lines = [f"{layout.controller_ip}\t{CONTROLLER}"]
    if layout.login:
        lines.append(f"{layout.login_ip}\t{LOGIN}")
    lines += [f"{ip}\t{name}" for name, ip in zip(layout.nodes, layout.node_ips)]
    return "\n".join(lines) + "\n"


def render_resolv_conf(layout: Layout) -> str:
    return f"# torchhpc devcluster: dnsmasq on the controller bridge\nnameserver {layout.controller_ip}\n"


def ompi_env(layout: Layout) -> dict[str, str]:
    """What OpenMPI needs to run as root over the cluster's veths.

    ``if_include`` takes the subnet (not ``eth0``) so mpirun also works from the
    controller namespace, whose interface is the bridge.
    """
    return {
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        "OMPI_MCA_btl": "self,tcp",
        "OMPI_MCA_pml": "ob1",
        "OMPI_MCA_btl_tcp_if_include": layout.subnet,
        "OMPI_MCA_oob_tcp_if_include": layout.subnet,
    }


def render_client_wrapper(
    program: str, real_path: str, host_netns: str, ctl_netns_path: str, binds: dict[str, str]
) -> str:
    """A ``sbatch`` (etc.) on PATH that reaches the controller from the host.

    From the host's network namespace (identified by its ``net:[inode]`` link)
    it enters the controller namespace and, in a private mount namespace,
    bind-mounts the cluster's hosts/resolv.conf (``srun --mpi=pmix`` resolves
    node names on the submit side). Anywhere else (inside a job, on a node) it
    runs the real program directly. The working directory, the files and the
    environment stay the caller's.
    """
    mounts = " && ".join(join(["mount", "--bind", src, dst]) for src, dst in binds.items())
    inner = (mounts + " && " if mounts else "") + 'exec "$0" "$@"'
    enter = ["nsenter", "--net=" + ctl_netns_path, "--", "unshare", "--mount", "--propagation", "private"]
    return (
        "#!/bin/sh\n"
        f"# torchhpc devcluster client wrapper for {program}: written by `torchhpc devcluster up`.\n"
        f'if [ "$(readlink /proc/self/ns/net)" = {quote(host_netns)} ]; then\n'
        f'  exec {join([*enter, "--", "sh", "-c", inner, real_path])} "$@"\n'
        "fi\n"
        f'exec {quote(real_path)} "$@"\n'
    )
