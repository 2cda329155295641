"""The dev cluster's login node: a real OpenSSH server in a namespace of its own.

``devcluster up --login`` starts ``sshd`` like a slurmd (``nsenter --net`` +
``unshare --mount --uts``, the cluster's hosts file bind-mounted, hostname
``login``), so ``torchhpc run --remote`` can be tested against a real login
node: real key authentication, a real second Unix user, real Slurm clients
behind it. Everything it needs lives under ``STATE_DIR/login/``:

* a host key and a client key (``id_ed25519``) made at ``up``;
* ``authorized_keys/USER``: sshd reads the keys of each user from there
  (``AuthorizedKeysFile``), so no one's ``~/.ssh`` is touched;
* ``ssh_config``: a ``Host`` block that reaches the node through a
  ProxyCommand into the controller's namespace (``nsenter`` + ``socat``), so
  the host's own network gets no address, route or listening port.

Sessions get the cluster's client settings (``SLURM_CONF``, the OpenMPI
variables, ``TORCHHPC_DEVCLUSTER_DIR``) through sshd's ``SetEnv``: the login
node is a Slurm submit host like a site's.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Callable, Sequence
from contextlib import suppress

import torchhpc.devcluster.config as config
import torchhpc.devcluster.netns as netns
from torchhpc.core.proc import Runner
from torchhpc.core.shell import Raw, join
from torchhpc.devcluster.config import LOGIN, Layout
from torchhpc.errors import DevClusterError

__all__ = [
    "LOGIN_PACKAGES", "SSH_PORT", "authorize", "ensure_user", "host_alias", "login_dir", "render_ssh_config",
    "render_sshd_config", "write_keys",
]

SSH_PORT = 22
# program -> Debian package, installed by `up --login` when missing.
LOGIN_PACKAGES: dict[str, str] = {"sshd": "openssh-server", "ssh": "openssh-client", "socat": "socat"}
# The one directory sshd insists on for privilege separation (Debian's init script makes it).
PRIVSEP_DIR = "/run/sshd"


def login_dir(state_dir: str, *parts: str) -> str:
    return os.path.join(state_dir, "login", *parts)


def host_alias(layout: Layout) -> str:
    """The ``Host`` name of the login node: ``torchhpc-login``, or ``torchhpc-<hash>-login`` beside it."""
    return f"{layout.netns_prefix}-{LOGIN}"


def _config_value(value: str, what: str) -> str:
    """A value for an ssh/sshd config line: double-quoted when it has spaces; refused when it cannot be."""
    if any(c in value for c in '"\n\r\\'):
        raise DevClusterError(
            f"{what} {value!r} cannot be written into an ssh config file (quote, backslash or newline)",
            "use a --state-dir whose path has none of these",
        )
    return f'"{value}"' if any(c.isspace() for c in value) else value


def ensure_user(name: str, runner: Runner, progress: Callable[[str], None]) -> pwd.struct_passwd:
    """The account ``name``, created (``useradd --create-home``) when it does not exist.

    sshd without PAM refuses a locked account (a password field starting with
    ``!``, useradd's default): a new account gets ``*`` (no password, not locked).
    """
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        progress(f"creating user {name} (useradd --create-home) for the login node")
        runner.run(["useradd", "--create-home", "--password", "*", name], timeout=30,
                   hint="create the user by hand, or pick another --login-user")
        entry = pwd.getpwnam(name)
    if _locked(name):
        raise DevClusterError(
            f"user {name} is locked (its password starts with '!'): sshd will refuse it",
            f"unlock it without a password: usermod --password '*' {name}",
        )
    return entry


def _locked(name: str) -> bool:
    with suppress(OSError), open("/etc/shadow") as f:
        for line in f:
            fields = line.split(":")
            if fields[0] == name and len(fields) > 1:
                return fields[1].startswith("!")
    return False


def write_keys(layout: Layout, runner: Runner) -> None:
    """Host key, client key and known_hosts, made fresh at every ``up``."""
    d = login_dir(layout.state_dir)
    os.makedirs(os.path.join(d, "authorized_keys"), mode=0o755, exist_ok=True)
    for key in ("ssh_host_ed25519_key", "id_ed25519"):
        for path in (os.path.join(d, key), os.path.join(d, key + ".pub")):
            if os.path.exists(path):
                os.remove(path)
        runner.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"torchhpc devcluster {key}",
                    "-f", os.path.join(d, key)], timeout=30)
    with open(os.path.join(d, "ssh_host_ed25519_key.pub")) as f:
        host_key = " ".join(f.read().split()[:2])
    with open(os.path.join(d, "known_hosts"), "w") as f:
        f.write(f"{host_alias(layout)} {host_key}\n")


def authorize(layout: Layout, users: Sequence[str]) -> None:
    """Let each user in with the cluster's client key (one file per user, read by sshd as root)."""
    d = login_dir(layout.state_dir)
    with open(os.path.join(d, "id_ed25519.pub")) as f:
        key = f.read()
    for user in users:
        path = os.path.join(d, "authorized_keys", user)
        with open(path, "w") as f:
            f.write(key)
        os.chmod(path, 0o644)


def render_sshd_config(layout: Layout, env: dict[str, str]) -> str:
    """sshd_config of the login node: keys only, no PAM, the cluster's client settings in every session."""
    d = login_dir(layout.state_dir)
    setenv = " ".join(_config_value(f"{k}={v}", "environment value") for k, v in sorted(env.items()))
    lines = [
        "# Written by `torchhpc devcluster up --login`; rewritten on every up.",
        f"ListenAddress {layout.login_ip}:{SSH_PORT}",
        f"HostKey {_config_value(os.path.join(d, 'ssh_host_ed25519_key'), 'path')}",
        f"PidFile {_config_value(os.path.join(d, 'sshd.pid'), 'path')}",
        # %u: one file per user in the state dir; no one's ~/.ssh is read or written.
        f"AuthorizedKeysFile {_config_value(os.path.join(d, 'authorized_keys', '%u'), 'path')}",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        # No PAM: Debian's sshd PAM stack needs a writable loginuid, which a namespace may not have.
        "UsePAM no",
        "PermitRootLogin prohibit-password",
        # The keys live in the state dir, under /var/tmp (sticky, world-writable), which StrictModes
        # rejects as a parent; the files and their own directories are root's, 0644/0755.
        "StrictModes no",
        # One "Accepted publickey" line per connection: the remote tests count them.
        "LogLevel INFO",
        "PrintMotd no",
        "X11Forwarding no",
        "Subsystem sftp internal-sftp",
        f"SetEnv {setenv}",
    ]
    return "\n".join(lines) + "\n"


def session_env(layout: Layout) -> dict[str, str]:
    """What every ssh session on the login node sees: a Slurm submit host of this cluster."""
    return {
        "SLURM_CONF": layout.slurm_conf,
        "TORCHHPC_DEVCLUSTER_DIR": layout.state_dir,
        **config.ompi_env(layout),
    }


def render_ssh_config(layout: Layout, user: str) -> str:
    """The ``Host`` block a client on this machine uses (``ssh -F FILE HOST`` or pasted into ~/.ssh/config).

    The ProxyCommand enters the controller's namespace (it holds the bridge) and
    relays stdin/stdout to the login node's port 22: nothing listens on the
    host. It needs root, as the dev cluster does.
    """
    d = login_dir(layout.state_dir)
    proxy = join(["nsenter", "--net=" + netns.netns_path(layout.controller_netns), "--",
                  "socat", "STDIO", Raw("TCP:%h:%p")])
    lines = [
        f"Host {host_alias(layout)}",
        f"  HostName {layout.login_ip}",
        f"  Port {SSH_PORT}",
        f"  User {_config_value(user, 'user')}",
        f"  IdentityFile {_config_value(os.path.join(d, 'id_ed25519'), 'path')}",
        "  IdentitiesOnly yes",
        f"  UserKnownHostsFile {_config_value(os.path.join(d, 'known_hosts'), 'path')}",
        f"  HostKeyAlias {host_alias(layout)}",
        "  StrictHostKeyChecking yes",
        "  BatchMode yes",
        f"  ProxyCommand {proxy}",
    ]
    return "\n".join(lines) + "\n"


def write_configs(layout: Layout, users: Sequence[str]) -> None:
    d = login_dir(layout.state_dir)
    with open(os.path.join(d, "sshd_config"), "w") as f:
        f.write(render_sshd_config(layout, session_env(layout)))
    # The first user is the default of `devcluster ssh` / `ssh-config`.
    with open(os.path.join(d, "ssh_config"), "w") as f:
        f.write(render_ssh_config(layout, users[0]))


def sshd_argv(layout: Layout, sshd: str) -> list[str]:
    """sshd in the foreground (-D), logging to stderr (-e: the daemon's log file)."""
    os.makedirs(PRIVSEP_DIR, mode=0o755, exist_ok=True)
    return [sshd, "-D", "-e", "-f", login_dir(layout.state_dir, "sshd_config")]


def invoking_user() -> str:
    """Who runs ``up``: root here (the dev cluster needs it)."""
    return pwd.getpwuid(os.geteuid()).pw_name
