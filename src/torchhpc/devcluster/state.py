"""The state file of a dev cluster: what ``up`` started, where, and how to reach it.

``state.json`` in the state directory records the namespaces, addresses and
the PIDs (with start times) of every daemon, so ``down`` stops exactly those
and ``load_state`` can tell a healthy cluster from a stale record.
"""

from __future__ import annotations

import json
import os
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

import torchhpc.devcluster.config as config
import torchhpc.devcluster.daemons as daemons
import torchhpc.devcluster.netns as netns
from torchhpc.core.shell import join
from torchhpc.devcluster.config import CONTROLLER, LOGIN, Layout
from torchhpc.devcluster.daemons import Daemon
from torchhpc.errors import DevClusterError

__all__ = ["ClusterState", "default_state_dir", "load_state", "read_state"]

STATE_FILE = "state.json"
ENV_STATE_DIR = "TORCHHPC_DEVCLUSTER_DIR"
DOWN_HINT = "torchhpc devcluster down"


def down_hint(state_dir: str) -> str:
    """The exact ``down`` command for this state dir (``--state-dir`` only when not the default)."""
    if os.path.abspath(state_dir) == config.DEFAULT_STATE_DIR:
        return DOWN_HINT
    return join(["torchhpc", "devcluster", "down", "--state-dir", os.path.abspath(state_dir)])


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
    # nodes `devcluster fail` took down (their slurmd is meant to be dead until `revive`)
    failed: list[str] = field(default_factory=list)
    # ``up --login``: the login node's address ("" without one) and who may ssh in.
    login_ip: str = ""
    login_users: list[str] = field(default_factory=list)
    # CPUs slurm.conf declares on each node (not the machine's cores: every node shares those)
    cpus_per_node: int = config.CPUS_PER_NODE
    # seconds the controller remembers an ended job before only sacct knows it (MinJobAge)
    min_job_age: int = config.MIN_JOB_AGE

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

    def shm_dir(self, node: str) -> str:
        """``node``'s own /dev/shm, seen from the machine (config.Layout.shm_dir)."""
        return self._layout().shm_dir(node)

    def _layout(self) -> Layout:
        return Layout(
            state_dir=self.state_dir,
            nodes=tuple(self.nodes),
            node_ips=tuple(self.node_ips[n] for n in self.nodes),
            controller_ip=self.controller_ip,
            prefix_len=int(self.subnet.split("/")[1]),
            netns_prefix=config.netns_prefix_for(self.state_dir),
            login=bool(self.login_ip),
        )

    def healthy(self) -> bool:
        """Every recorded daemon still runs and every namespace still exists."""
        return (
            bool(self.daemons)
            and all(daemons.alive(d) for d in self.daemons if d.name.removeprefix("slurmd-") not in self.failed)
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
            "cpus_per_node": self.cpus_per_node,
            "min_job_age": self.min_job_age,
            "daemons": [d.to_json() for d in self.daemons],
            "up_seconds": self.up_seconds,
            "started_at": self.started_at,
            "failed": list(self.failed),
            **({"login": {"ip": self.login_ip, "netns": self.netns_names[LOGIN], "users": self.login_users}}
               if self.login_ip else {}),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ClusterState:
        nodes = [n["name"] for n in d["nodes"]]
        ns = {n["name"]: n["netns"] for n in d["nodes"]}
        ns[d["controller"]["name"]] = d["controller"]["netns"]
        login = d.get("login") or {}
        if login:
            ns[LOGIN] = login["netns"]
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
            cpus_per_node=int(d.get("cpus_per_node", config.CPUS_PER_NODE)),
            min_job_age=int(d.get("min_job_age", config.MIN_JOB_AGE)),
            daemons=[Daemon.from_json(x) for x in d.get("daemons", [])],
            up_seconds=float(d.get("up_seconds", 0.0)),
            started_at=float(d.get("started_at", 0.0)),
            failed=[str(n) for n in d.get("failed", [])],
            controller=d["controller"]["name"],
            login_ip=str(login.get("ip", "")),
            login_users=[str(u) for u in login.get("users", [])],
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
        raise DevClusterError(
            f"{path} is not a dev cluster state file ({e})", f"run `{down_hint(os.path.dirname(path))}`"
        ) from None


def load_state(state_dir: str | None = None) -> ClusterState | None:
    """The running dev cluster, or None when none is up (or it is no longer healthy)."""
    try:
        state = read_state(state_dir)
    except DevClusterError:
        return None
    if state is None or not state.healthy():
        return None
    return state


def _remove_state_file(sdir: str) -> None:
    with suppress(FileNotFoundError):
        os.remove(os.path.join(sdir, STATE_FILE))
