"""``torchhpc devcluster``: a real multi-node Slurm cluster on this Linux box.

Thin layer over :mod:`torchhpc.devcluster`: parse, call, print.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from torchhpc.cli.common import add_subparser, after_dashdash, eprint, help_when_bare
from torchhpc.core.shell import export_lines, join
from torchhpc.errors import DevClusterError, UsageError

DESCRIPTION = """\
A real Slurm cluster in network namespaces on this machine (Linux, root):
one namespace per node (node1..nodeN, 4 CPUs each by default, partition `debug`) plus one
for the controller, munged, slurmctld, one slurmd per node and, with
--accounting, MariaDB + slurmdbd so `sacct` works. Nodes share this machine's
filesystem, so jobs can run this checkout's .venv/bin/python.

  torchhpc devcluster up --nodes 3 --accounting
  torchhpc devcluster exec -- sinfo
  eval "$(torchhpc devcluster env)"; sbatch job.sh
  torchhpc devcluster shell node1
  torchhpc devcluster up --nodes 3 --login --login-user alice    (+ a login node: real sshd)
  torchhpc devcluster ssh-config >> ~/.ssh/config; torchhpc devcluster ssh --user alice
  torchhpc devcluster down

State directory: --state-dir > $TORCHHPC_DEVCLUSTER_DIR > /var/tmp/torchhpc-devcluster.
"""


def register(sub: Any) -> None:
    p = add_subparser(
        sub, "devcluster", "run a real multi-node Slurm dev cluster on this machine", DESCRIPTION
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--state-dir",
        default=None,
        help="where the cluster lives (default: $TORCHHPC_DEVCLUSTER_DIR or /var/tmp/torchhpc-devcluster)",
    )
    actions = p.add_subparsers(dest="devcluster_action", metavar="ACTION")
    help_when_bare(p)

    up = actions.add_parser(
        "up", parents=[common], help="bring the cluster up (installs missing Debian packages)",
        description="Create the namespaces, write slurm.conf, start the daemons and wait until every node is idle.",
    )  # fmt: skip
    up.add_argument("--nodes", type=int, default=3, help="number of compute nodes (default 3)")
    up.add_argument("--accounting", action="store_true", help="also run MariaDB + slurmdbd so sacct works")
    up.add_argument("--cpus-per-node", type=int, default=4, metavar="N",
                    help="CPUs each node declares (default 4); the nodes share this machine's cores, so more "
                         "only lets more jobs run at once")
    up.add_argument(
        "--timeout", type=float, default=120.0, help="seconds to wait for each daemon (default 120)"
    )
    up.add_argument("--login", action="store_true",
                    help="also a login node: a real OpenSSH server in its own namespace (see `ssh-config`)")
    up.add_argument("--login-user", action="append", default=[], metavar="USER",
                    help="a user who may ssh into the login node besides you (repeatable; implies --login; "
                         "created with useradd when missing)")
    up.set_defaults(func=cmd_up)

    sc = actions.add_parser(
        "ssh-config", parents=[common], help="print an ssh Host block for the login node (up --login)",
        description="A Host block for ~/.ssh/config or `ssh -F FILE`: it reaches the login node through a "
                    "ProxyCommand into the cluster's namespaces (nothing listens on this machine's network).",
    )  # fmt: skip
    sc.add_argument("--user", default=None, help="log in as USER (default: the user who ran up)")
    sc.set_defaults(func=cmd_ssh_config)

    ss = actions.add_parser("ssh", parents=[common], help="ssh into the login node (a shell, or CMD after --)")
    ss.add_argument("--user", default=None, help="log in as USER (default: the user who ran up)")
    ss.add_argument("cmd", nargs=argparse.REMAINDER, help="a command to run there, after `--`")
    ss.set_defaults(func=cmd_ssh)

    st = actions.add_parser("status", parents=[common], help="daemons and node states")
    st.add_argument("--json", action="store_true", help="print the status as JSON")
    st.set_defaults(func=cmd_status)

    ex = actions.add_parser(
        "exec", parents=[common], help="run a command with the cluster's client env (SLURM_CONF, PATH, OMPI_*)",
        description="Run CMD on the login side: `torchhpc devcluster exec -- sbatch job.sh`.",
    )  # fmt: skip
    ex.add_argument("cmd", nargs=argparse.REMAINDER, help="the command, after `--`")
    ex.set_defaults(func=cmd_exec)

    env = actions.add_parser(
        "env", parents=[common], help="print export lines for the client env: eval \"$(torchhpc devcluster env)\"",
    )  # fmt: skip
    env.set_defaults(func=cmd_env)

    sh = actions.add_parser(
        "shell", parents=[common], help="interactive shell on a node (its network, hostname and /etc/hosts)"
    )
    sh.add_argument("node", help="node1..nodeN, or ctl for the controller")
    sh.set_defaults(func=cmd_shell)

    dn = actions.add_parser("down", parents=[common], help="stop exactly what `up` started; idempotent")
    dn.set_defaults(func=cmd_down)

    dg = actions.add_parser(
        "degrade", parents=[common], help="slow one node's link (tc tbf, both directions): a fault to find",
        description="Limit NODE's link to --rate with a tc token-bucket filter on both ends of its veth "
                    "(e.g. 1/10 of the rate iperf3 measures between two nodes). `restore NODE` undoes it.",
    )  # fmt: skip
    dg.add_argument("node", help="node1..nodeN")
    dg.add_argument("--rate", required=True, help="link rate in tc's units: 100mbit, 1gbit, 50mbps (bytes/s)")
    dg.set_defaults(func=cmd_degrade)
    rs = actions.add_parser("restore", parents=[common], help="remove the limit `degrade` put on a node's link")
    rs.add_argument("node", help="node1..nodeN")
    rs.set_defaults(func=cmd_restore)

    fl = actions.add_parser(
        "fail", parents=[common], help="fail a node as a power loss would: cut its link, kill its processes, empty its memory",
        description="Cut NODE's link (both ends of its veth), then SIGKILL every process in its namespace: "
                    "slurmd, slurmstepd and every rank; empty its shared memory (each node has its own /dev/shm). "
                    "Slurm marks it down after SlurmdTimeout. "
                    "Idempotent; `revive NODE` brings it back.",
    )  # fmt: skip
    fl.add_argument("node", help="node1..nodeN")
    fl.set_defaults(func=cmd_fail)
    rv = actions.add_parser(
        "revive", parents=[common], help="bring a failed node back: link up, slurmd started again",
        description="Undo `fail NODE`: its link comes up and its slurmd starts; Slurm returns it to service "
                    "when it registers. Idempotent.",
    )  # fmt: skip
    rv.add_argument("node", help="node1..nodeN")
    rv.set_defaults(func=cmd_revive)


def cmd_up(args: argparse.Namespace) -> int:
    from torchhpc import devcluster

    state = devcluster.up(
        nodes=args.nodes,
        accounting=args.accounting,
        state_dir=args.state_dir,
        progress=lambda msg: eprint(f"devcluster: {msg}"),
        timeout=args.timeout,
        login=args.login,
        login_users=args.login_user,
        cpus_per_node=args.cpus_per_node,
    )
    sd = [] if args.state_dir is None else ["--state-dir", state.state_dir]
    nodes = state.nodes
    print(
        f"Dev cluster up in {state.up_seconds:.1f} s: {len(nodes)} nodes ({nodes[0]}..{nodes[-1]}, {state.cpus_per_node} CPUs each), "
        f"partition {devcluster.PARTITION}, accounting {'on' if state.accounting else 'off'}."
    )
    print(f"  memory per node:  {_memory_line(devcluster.status(args.state_dir))}")
    print(f"  run a client:     {join(['torchhpc', 'devcluster', 'exec', *sd, '--', 'sinfo'])}")
    print(f'  in this shell:    eval "$({join(["torchhpc", "devcluster", "env", *sd])})"; sbatch job.sh')
    print(f"  on a node:        {join(['torchhpc', 'devcluster', 'shell', *sd, nodes[0]])}")
    if state.login_ip:
        print(f"  login node:       {join(['torchhpc', 'devcluster', 'ssh', *sd])}   "
              f"(users {', '.join(state.login_users)}; Host block: "
              f"{join(['torchhpc', 'devcluster', 'ssh-config', *sd])})")
    print(f"  stop it:          {join(['torchhpc', 'devcluster', 'down', *sd])}")
    print(f"  slurm.conf:       {state.slurm_conf}   (logs in {os.path.join(state.state_dir, 'log')})")
    return 0


def _need_state(state_dir: str | None) -> Any:
    from torchhpc import devcluster

    state = devcluster.load_state(state_dir)
    if state is None:
        where = devcluster.default_state_dir(state_dir)
        raise DevClusterError(
            f"no healthy dev cluster is up in {where}",
            "start one with `torchhpc devcluster up --nodes 3 --accounting` "
            "(or `torchhpc devcluster down` first if one half-died)",
        )
    return state


def cmd_status(args: argparse.Namespace) -> int:
    from torchhpc import devcluster

    info = devcluster.status(args.state_dir)
    if args.json:
        print(json.dumps(info, indent=2))
        return 0 if info.get("healthy") else 1
    if not info["up"]:
        print(f"No dev cluster in {info['state_dir']}.")
        return 1
    health = "healthy" if info["healthy"] else "NOT healthy (a daemon died; run `torchhpc devcluster down`)"
    print(f"Dev cluster in {info['state_dir']}: {health}; accounting {'on' if info['accounting'] else 'off'}")
    print(
        f"  controller {info['controller']['name']} {info['controller']['ip']}  SLURM_CONF={info['slurm_conf']}"
    )
    print(f"  memory per node: {_memory_line(info)}")
    for n in info["nodes"]:
        cpus = "?" if n.get("cpus") is None else n["cpus"]
        mem = "?" if n.get("memory_mb") is None else f"{n['memory_mb']} MiB"
        print(f"  {n['name']:<8} {n['ip']:<15} {n['state']:<10} {cpus} CPUs  {mem}")
    if info.get("login"):
        lg = info["login"]
        print(f"  login    {lg['ip']:<15} ssh {lg['host']} (users {', '.join(lg['users'])}; "
              "`torchhpc devcluster ssh-config` prints its Host block)")
    dead = [d["name"] for d in info["daemons"] if not d["alive"]]
    print(f"  daemons: {len(info['daemons']) - len(dead)}/{len(info['daemons'])} running" + (
        f" (stopped: {', '.join(dead)})" if dead else ""
    ))  # fmt: skip
    return 0 if info["healthy"] else 1


def _memory_line(info: dict[str, Any]) -> str:
    """``23552 MiB declared (RealMemory) on each of 32 nodes, all sharing this machine's 24064 MiB``."""
    mems = sorted({n["memory_mb"] for n in info.get("nodes", []) if n.get("memory_mb") is not None})
    declared = "unknown (sinfo did not answer)" if not mems else " / ".join(f"{m} MiB" for m in mems)
    host = info.get("host_memory_mb")
    shared = f", all sharing this machine's {host} MiB" if host else ""
    return f"{declared} declared (RealMemory) on each of {len(info.get('nodes', []))} nodes{shared}"


def cmd_exec(args: argparse.Namespace) -> int:
    from torchhpc import devcluster

    cmd = after_dashdash(args.cmd)
    if not cmd:
        raise UsageError("devcluster exec needs a command", "e.g. `torchhpc devcluster exec -- sinfo`")
    return devcluster.run_client(_need_state(args.state_dir), cmd)


def cmd_env(args: argparse.Namespace) -> int:
    state = _need_state(args.state_dir)
    env = state.client_env()
    keys = ["PATH", "SLURM_CONF", *sorted(k for k in env if k.startswith("OMPI_"))]
    for line in export_lines({k: env[k] for k in keys}):
        print(line)
    return 0


def cmd_shell(args: argparse.Namespace) -> int:
    import subprocess

    from torchhpc import devcluster

    state = _need_state(args.state_dir)
    argv = devcluster.shell_argv(state, args.node)
    # Interactive: the terminal is passed through, so not the capturing Runner.
    return subprocess.call(argv, env=state.client_env())


def _need_login(state_dir: str | None) -> Any:
    state = _need_state(state_dir)
    if not state.login_ip:
        raise DevClusterError(
            f"the dev cluster in {state.state_dir} has no login node",
            "bring it up with `torchhpc devcluster up --login` (after `torchhpc devcluster down`)",
        )
    return state


def cmd_ssh_config(args: argparse.Namespace) -> int:
    from torchhpc.devcluster.login import render_ssh_config

    state = _need_login(args.state_dir)
    print(render_ssh_config(state._layout(), args.user or state.login_users[0]), end="")
    return 0


def cmd_ssh(args: argparse.Namespace) -> int:
    import subprocess

    from torchhpc.devcluster.login import host_alias, login_dir

    state = _need_login(args.state_dir)
    cmd = after_dashdash(args.cmd)
    argv = ["ssh", "-F", login_dir(state.state_dir, "ssh_config")]
    if args.user:
        argv += ["-l", args.user]
    if not cmd:
        argv.append("-t")  # an interactive shell wants a terminal; BatchMode only stops prompts
    argv.append(host_alias(state._layout()))
    if cmd:
        # ssh joins its arguments into one line for the remote shell: quote each word here.
        argv += ["--", join(cmd)]
    return subprocess.call(argv)


def cmd_down(args: argparse.Namespace) -> int:
    from torchhpc import devcluster

    devcluster.down(args.state_dir, progress=lambda msg: eprint(f"devcluster: {msg}"))
    return 0


def cmd_degrade(args: argparse.Namespace) -> int:
    from torchhpc.devcluster.degrade import degrade

    bits = degrade(_need_state(args.state_dir), args.node, args.rate)
    print(f"{args.node}: link limited to {bits / 1e6:g} Mbit/s both ways "
          f"(`torchhpc devcluster restore {args.node}` undoes it)")
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    from torchhpc.devcluster.degrade import restore

    had = restore(_need_state(args.state_dir), args.node)
    print(f"{args.node}: link restored" if had else f"{args.node}: link was not limited")
    return 0


def cmd_fail(args: argparse.Namespace) -> int:
    from torchhpc.devcluster.fault import fail

    done = fail(_need_state(args.state_dir), args.node)  # an unknown node: a usage error before anything is touched
    print(f"{args.node}: failed: " + ", ".join(done) if done else f"{args.node}: already failed (link down, no process)")
    return 0


def cmd_revive(args: argparse.Namespace) -> int:
    from torchhpc.devcluster.fault import revive

    done = revive(_need_state(args.state_dir), args.node)
    print(f"{args.node}: revived: " + ", ".join(done) if done else f"{args.node}: already up (link up, slurmd running)")
    return 0
