"""The transport of ``--remote``: the system's ``ssh`` client, one master connection per session.

The system client, not a Python SSH library, so ``~/.ssh/config``, ProxyJump,
keys, agents and hardware tokens work as they do in a terminal. The first call
of a session opens a master connection (``ControlMaster``) in a private
directory and leaves it up for ``ControlPersist``; every later command of the
session, from this process or the next ``torchhpc`` call, rides on it, so a
two-factor login is asked for once.

The master is opened on its own, in the foreground with the terminal (so a
password or token prompt can be answered) and then backgrounded by ssh
(``-f``): a command whose output is captured never becomes the master, whose
daemonised process could hold the capture pipe open.

Commands reach the remote login shell as one line: :func:`remote_line` wraps a
bash script (every word quoted by :mod:`torchhpc.core.shell`) in ``bash -c``
with POSIX single quotes, which every Bourne-like login shell reads alike.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import stat
import subprocess
import sys
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from torchhpc.errors import RemoteError, UsageError
from torchhpc.remote.route import check_host

__all__ = ["ENV_CONFIG", "ENV_CONTROL_DIR", "PERSIST", "Ssh", "check_host", "control_dir", "remote_line"]

ENV_CONFIG = "TORCHHPC_SSH_CONFIG"
ENV_CONTROL_DIR = "TORCHHPC_SSH_CONTROL_DIR"
# How long an idle master stays up after the last command: a working session, not a day.
PERSIST = "10m"


def control_dir() -> str:
    """A directory only this user can enter, for the master's socket (short: sockets have a ~100 byte limit)."""
    path = os.environ.get(ENV_CONTROL_DIR) or os.path.join("/tmp", f"torchhpc-ssh-{os.geteuid()}")
    with suppress(FileExistsError):
        os.mkdir(path, 0o700)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise RemoteError(
            f"{path} is not a private directory of yours (owner uid {st.st_uid}, mode {stat.filemode(st.st_mode)})",
            f"remove it, or point {ENV_CONTROL_DIR} at a directory only you can enter",
        )
    return path


def remote_line(script: str) -> str:
    """The one line ssh hands to the remote login shell: ``bash -c 'SCRIPT'``."""
    return "bash -c " + shlex.quote(script)


@dataclass
class Ssh:
    """ssh to one ``[USER@]HOST`` through a shared master connection."""

    host: str
    config: str | None = None  # $TORCHHPC_SSH_CONFIG: an extra config file
    ctl_dir: str | None = None

    def __post_init__(self) -> None:
        check_host(self.host)
        if self.config is None:
            self.config = os.environ.get(ENV_CONFIG) or None
        self._master_checked = False

    def options(self) -> list[str]:
        """The options every call shares: the extra config and the master's socket."""
        opts: list[str] = []
        if self.config:
            opts += ["-F", self._combined_config()]
        ctl = self.ctl_dir or control_dir()
        opts += ["-o", f"ControlPath={ctl}/%C", "-o", f"ControlPersist={PERSIST}"]
        return opts

    def _combined_config(self) -> str:
        """``-F`` replaces ~/.ssh/config; a small file that includes the extra file first, then the
        user's and the system's, keeps them all (first value found wins in ssh)."""
        assert self.config
        extra = os.path.abspath(os.path.expanduser(self.config))
        if not os.path.isfile(extra):
            raise UsageError(f"{ENV_CONFIG}={self.config!r} is not a file", "point it at an ssh config file, or unset it")
        lines = [f'Include "{extra}"']
        user = os.path.expanduser("~/.ssh/config")
        if os.path.isfile(user):
            lines.append(f'Include "{user}"')
        lines.append('Include "/etc/ssh/ssh_config"')
        text = "\n".join(lines) + "\n"
        path = os.path.join(self.ctl_dir or control_dir(), f"config-{hashlib.sha1(text.encode()).hexdigest()[:12]}")
        if not os.path.exists(path):
            with open(path, "w") as f:
                f.write(text)
        return path

    def argv(self, line: str, *, tty: bool = False) -> list[str]:
        return ["ssh", *self.options(), *(["-t"] if tty else []), "-o", "ControlMaster=no", self.host, "--", line]

    def master_argv(self) -> list[str]:
        return ["ssh", *self.options(), "-o", "ControlMaster=yes", "-N", "-f", self.host]

    def ensure_master(self) -> None:
        """Open the master connection unless one is up (``ssh -O check``); once per process."""
        if self._master_checked:
            return
        check = ["ssh", *self.options(), "-O", "check", self.host]
        if subprocess.run(check, stdin=subprocess.DEVNULL, capture_output=True).returncode != 0:
            done = subprocess.run(self.master_argv(), stdout=subprocess.DEVNULL)
            if done.returncode != 0:
                raise RemoteError(
                    f"cannot connect to {self.host} (ssh exit code {done.returncode}; its message is above)",
                    f"check that `ssh {self.host}` works in a terminal"
                    + (f" (with -F {self.config})" if self.config else ""),
                )
        self._master_checked = True

    def run(self, script: str, *, input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
        """Run a bash script there; stdout captured, stderr passed through (warnings, progress)."""
        self.ensure_master()
        return subprocess.run(self.argv(remote_line(script)), input=input if input is not None else b"",
                              stdout=subprocess.PIPE)

    def stream(self, script: str, *, tty: bool = False, stdout: Any = None) -> int:
        """Run a bash script there with its output passed through; its exit code."""
        self.ensure_master()
        sys.stdout.flush()
        sys.stderr.flush()
        return subprocess.call(self.argv(remote_line(script), tty=tty), stdout=stdout,
                               stdin=None if tty else subprocess.DEVNULL)

    def shown(self, script: str, *, tty: bool = False) -> list[str]:
        """The ssh command as it would run (for --dry-run): the command line, then the script it passes."""
        words = self.argv("SCRIPT", tty=tty)[:-1]
        return [" ".join(shlex.quote(a) for a in words) + " 'bash -c SCRIPT', where SCRIPT is:",
                *("    " + line for line in script.rstrip("\n").splitlines())]


def command_words(command: str) -> Sequence[str]:
    """$TORCHHPC_REMOTE_COMMAND split into words; a leading ``~/`` stays the remote home."""
    try:
        words = shlex.split(command)
    except ValueError as e:
        raise UsageError(f"TORCHHPC_REMOTE_COMMAND={command!r} cannot be split into words ({e})",
                         "write it as a command line, e.g. `~/venv/bin/torchhpc`") from None
    if not words:
        raise UsageError("TORCHHPC_REMOTE_COMMAND is empty", "unset it (default: torchhpc) or name the program")
    return words
