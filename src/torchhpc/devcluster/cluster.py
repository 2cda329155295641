"""Bring the dev cluster up and down, and describe the one that is up.

Everything lives under one state directory (see :mod:`.state`); ``down``
stops exactly the recorded daemons, then whatever still runs inside the
cluster's own namespaces, and deletes those namespaces.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import platform
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import suppress
from typing import Any

import torchhpc.devcluster.bringup as bringup
import torchhpc.devcluster.config as config
import torchhpc.devcluster.daemons as daemons
import torchhpc.devcluster.netns as netns
import torchhpc.devcluster.prepare as prepare
from torchhpc.core.proc import Runner
from torchhpc.devcluster.bringup import Client
from torchhpc.devcluster.config import CONTROLLER, LOGIN
from torchhpc.devcluster.prepare import binds, ensure_packages, host_memory_mb
from torchhpc.devcluster.state import (
    ClusterState,
    _remove_state_file,
    default_state_dir,
    down_hint,
    read_state,
)
from torchhpc.errors import CommandError, DevClusterError

__all__ = ["check_host", "down", "run_client", "shell_argv", "status", "up"]

DOWN_REMOVES = tuple(d for d in prepare.RUNTIME_DIRS if d != "log")


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


@contextlib.contextmanager
def _exclusive(state_dir: str | None) -> Iterator[None]:
    """One ``up``/``down`` at a time per state dir (two CI jobs, two terminals)."""
    sdir = default_state_dir(state_dir)
    os.makedirs(sdir, mode=0o755, exist_ok=True)
    with open(os.path.join(sdir, ".lock"), "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DevClusterError(
                f"another `torchhpc devcluster up/down` is running on {sdir}",
                "wait for it to finish, then check `torchhpc devcluster status`",
            ) from None
        yield


def up(
    nodes: int = 3,
    accounting: bool = False,
    state_dir: str | None = None,
    progress: Callable[[str], None] | None = print,
    runner: Runner | None = None,
    timeout: float = 120.0,
    login: bool = False,
    login_users: Sequence[str] = (),
    cpus_per_node: int = config.CPUS_PER_NODE,
    min_job_age: int = config.MIN_JOB_AGE,
) -> ClusterState:
    """Bring up a real multi-node Slurm cluster in network namespaces; returns its state.

    ``cpus_per_node``: the CPUs slurm.conf declares on each node (they all share this machine's
    cores; more lets more jobs run at once). ``login``: also a login node, a real sshd in its own
    namespace that lets in the invoking user and ``login_users`` (created when missing) with the
    cluster's key (:mod:`.login`). ``min_job_age``: Slurm's MinJobAge, the seconds an ended job stays
    known to the controller (a short one ages jobs into accounting: tests/integration/test_endings.py).

    Raises :class:`DevClusterError` when not root/Linux, when a cluster is
    already up in ``state_dir``, or when a daemon fails to start (then
    everything started so far is stopped again and the logs are kept).
    """
    config.check_cpus_per_node(cpus_per_node)  # a value refused before anything about the host
    check_host()
    with _exclusive(state_dir):
        say: Callable[[str], None] = progress or (lambda _m: None)
        runner = runner or Runner()
        sdir = default_state_dir(state_dir)
        _check_socket_room(sdir, nodes)
        login = login or bool(login_users)
        layout = config.make_layout(sdir, nodes, login=login)
        previous = read_state(sdir)
        if previous is not None:
            if previous.healthy():
                raise DevClusterError(
                    f"a dev cluster is already up in {sdir} ({len(previous.nodes)} nodes)",
                    f"use it, or run `{down_hint(sdir)}` first",
                )
            if any(daemons.alive(d) for d in previous.daemons):
                raise DevClusterError(
                    f"a dev cluster in {sdir} is partly running (some daemons died)",
                    f"run `{down_hint(sdir)}` to clean it up",
                )
        leftovers = netns.existing(layout.netns_prefix, runner)
        if leftovers and previous is None:
            raise DevClusterError(
                f"network namespaces {', '.join(leftovers)} exist but {sdir} records no cluster",
                f"run `{down_hint(sdir)}` (it removes them) or `ip netns delete NAME`",
            )
        if previous is not None:
            _down(sdir, runner=runner, progress=lambda _m: None)

        t0 = time.monotonic()
        installed = ensure_packages(accounting, runner, say, login=login)
        t_ready = time.monotonic()
        if installed:
            say(f"installed {' '.join(installed)} in {t_ready - t0:.0f} s")

        first_job_id = prepare.next_job_id(sdir)  # before prepare_dirs empties log/
        prepare.prepare_dirs(layout)

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
            host_netns=prepare.host_netns(),
            accounting=accounting,
            started_at=time.time(),
            cpus_per_node=cpus_per_node,
            min_job_age=min_job_age,
        )
        if login:
            from torchhpc.devcluster.login import invoking_user

            state.login_ip = layout.login_ip
            state.netns_names[LOGIN] = layout.login_netns
            state.login_users = list(dict.fromkeys([invoking_user(), *login_users]))
        try:
            prepare.write_files(layout, state, accounting, first_job_id)
            step(f"network: {len(layout.nodes)} node namespaces + {layout.controller_netns} on {layout.subnet}")
            netns.create(layout, runner)
            state.save()
            bringup.start_all(layout, state, accounting, runner, step, timeout)
            if login:
                bringup.start_login(layout, state, state.login_users, runner, step, timeout)
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


def down(
    state_dir: str | None = None,
    runner: Runner | None = None,
    progress: Callable[[str], None] | None = print,
) -> list[str]:
    """Stop exactly the recorded daemons and whatever runs in the cluster's namespaces,
    then delete the namespaces. Idempotent: returns what was stopped or removed
    (empty when nothing was up).
    """
    check_host()
    with _exclusive(state_dir):
        return _down(state_dir, runner, progress)


SUN_PATH_MAX = 107  # a unix socket's path, in bytes, less its terminating NUL (Linux sockaddr_un)


def _check_socket_room(sdir: str, nodes: int) -> None:
    """slurmd starts each job step's slurmstepd on a unix socket in its spool directory,
    ``<state dir>/spool/slurmd-NODE/NODE_JOBID.STEPID``: past 107 bytes the step cannot start and Slurm
    only says "launch failed requeued held" (a state dir under pytest-xdist's temporary folders did)."""
    node = f"node{nodes}"
    worst = os.path.join(os.path.abspath(sdir), "spool", f"slurmd-{node}", f"{node}_99999999.4294967291")
    if len(worst.encode()) > SUN_PATH_MAX:
        raise DevClusterError(
            f"--state-dir {sdir} is too long for Slurm's step sockets ({len(worst.encode())} bytes of "
            f"{SUN_PATH_MAX} in {worst})", f"a shorter directory, {len(worst.encode()) - SUN_PATH_MAX} bytes at least")


def _down(state_dir: str | None, runner: Runner | None, progress: Callable[[str], None] | None) -> list[str]:
    runner = runner or Runner()
    sdir = default_state_dir(state_dir)
    try:
        state = read_state(sdir)
    except DevClusterError:
        state = None  # a damaged state file: still remove the namespaces by name below
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
    shutil.rmtree(config.shm_root(sdir), ignore_errors=True)  # the nodes' own /dev/shm
    for d in DOWN_REMOVES:
        shutil.rmtree(os.path.join(sdir, d), ignore_errors=True)
    (progress or (lambda _m: None))(
        f"down: stopped {len(done)} daemons/namespaces in {sdir}"
        if done
        else f"down: nothing running in {sdir}"
    )
    return done


def _cancel_all_jobs(state: ClusterState, runner: Runner, wait: float = 10.0) -> None:
    """scancel every job so steps end through Slurm (epilogs, accounting) before the daemons stop."""
    client = Client(state, runner)
    with suppress(CommandError):  # a dying controller: the process sweep below still cleans up
        ids = client.run("squeue", "-h", "-o", "%i", timeout=10, check=False).split()
        if not ids:
            return
        client.run("scancel", *ids, timeout=10, check=False)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not client.run("squeue", "-h", "-o", "%i", timeout=10, check=False).split():
                return
            time.sleep(0.2)


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
    if state.login_ip:
        from torchhpc.devcluster.login import host_alias

        info["login"] = {"ip": state.login_ip, "host": host_alias(state._layout()), "users": state.login_users}
    node_info: dict[str, dict[str, str]] = {}
    if info["healthy"]:
        with suppress(CommandError):
            node_info = Client(state, runner or Runner()).node_info()
    info["nodes"] = [
        {
            "name": n,
            "ip": state.node_ips[n],
            "netns": state.netns_names[n],
            "state": node_info.get(n, {}).get("state", "unknown"),
            # What slurmd declares (RealMemory); every node shares this machine's memory.
            "cpus": _int_or_none(node_info.get(n, {}).get("cpus")),
            "memory_mb": _int_or_none(node_info.get(n, {}).get("memory_mb")),
        }
        for n in state.nodes
    ]
    info["host_memory_mb"] = host_memory_mb()
    return info


def _int_or_none(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


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
        ns, name, binds(state._layout(), name), [shell or os.environ.get("SHELL") or "/bin/bash"]
    )
