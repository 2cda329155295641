"""The one exception tree of torchhpc.

Library code raises these; only the CLI turns them into ``Error: ...`` and an
exit code. Every message names the offending value, where it came from, and
(through ``hint``) how to fix it.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence


class TorchHPCError(Exception):
    """Base of every error torchhpc raises on purpose."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        if self.hint:
            return f"{self.message} HINT: {self.hint}"
        return self.message


class UsageError(TorchHPCError):
    """Bad input from the user: a flag, a spec field, a profile key (exit 2)."""

    exit_code = 2


class SpecError(UsageError):
    """A job description that cannot be run as given."""


class QuotingError(UsageError):
    """A value that cannot be expressed in the target syntax (e.g. a pyxis mount list)."""


class ConfigError(UsageError):
    """A profile or config file with an unknown key or ill-typed value."""


class CommandError(TorchHPCError):
    """An external command (sbatch, squeue, kubectl, ...) failed.

    Carries argv, exit code and stderr so the user sees exactly what ran.
    """

    def __init__(
        self,
        argv: Sequence[str],
        returncode: int | None,
        stderr: str = "",
        hint: str | None = None,
        stdout: str = "",
    ) -> None:
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr
        self.stdout = stdout
        if hint is None:
            hint = next((known for needle, known in KNOWN_HINTS if needle in stderr), None)
        what = "timed out" if returncode is None else f"exited with code {returncode}"
        detail = stderr.strip().splitlines()[-1] if stderr.strip() else ""
        # shlex.join quotes exactly as core.shell.join (same safe set); errors sits below core.
        msg = f"`{shlex.join(self.argv)}` {what}" + (f": {detail}" if detail else "")
        super().__init__(msg, hint)


def name_flag_as(text: str, flag: str, name: str, assign: str, value_opens: str = "['\"\\d]") -> str:
    """``text`` (an error in ``run``'s words) with ``flag`` named as the caller wrote it: a pipeline
    file's key (``--partition 'x'`` -> ``partition = 'x'``) or a ``Job()`` keyword (``partition='x'``).
    ``--flag=V`` and ``--flag V`` (V opening with ``value_opens``: a quote or a digit) take ``assign``; a bare mention is ``name``."""
    at = rf"(?<![\w-]){re.escape(flag)}(?![\w-])"
    text = re.sub(at + rf"(?:=| (?={value_opens}))", lambda _m: name + assign, text)
    return re.sub(at, lambda _m: name, text)


# Messages of external tools whose cause is well known, and what to do about them.
KNOWN_HINTS: tuple[tuple[str, str], ...] = (
    (
        "Could not establish a configuration source",
        "this machine has no Slurm configuration: run on the cluster's login node, or point SLURM_CONF "
        "at its slurm.conf (for the dev cluster: `torchhpc devcluster exec -- torchhpc ...`)",
    ),
    *(
        (needle, "Slurm cannot read its slurm.conf: check that $SLURM_CONF (or /etc/slurm/slurm.conf) exists "
                 "and is readable")
        for needle in ("Unable to process configuration file", "s_p_parse_file: cannot stat file")
    ),
)


class CommandNotFound(CommandError):
    """The program itself is missing (e.g. no ``sbatch`` on this machine)."""

    def __init__(self, argv: Sequence[str], hint: str | None = None) -> None:
        super().__init__(argv, 127, f"{argv[0]}: command not found", hint)


class SchedulerError(TorchHPCError):
    """A scheduler answered something we cannot use (unknown job id, odd output)."""


class UnknownJob(SchedulerError):
    """The scheduler (and torchhpc's records) know no such job: every job command says so one way
    (cli/handles.py), never with a verdict or an empty answer."""

    exit_code = 2  # a handle that names no job is bad input (README's table), never a failed job's 1


class JobFailed(TorchHPCError):
    """A job (or one of its ranks) ended unsuccessfully.

    For a submitted function (``torchhpc.Executor``), ``rank`` is the first rank that
    raised, ``host`` its node and ``remote_traceback`` the traceback's text there
    (None for program jobs, and when no rank could say why).
    """

    def __init__(
        self,
        message: str,
        hint: str | None = None,
        returncode: int = 1,
        *,
        rank: int | None = None,
        host: str | None = None,
        remote_traceback: str | None = None,
    ) -> None:
        super().__init__(message, hint)
        self.exit_code = returncode if 0 < returncode < 256 else 1
        self.rank = rank
        self.host = host
        self.remote_traceback = remote_traceback


class WaitTimeout(JobFailed):
    """``wait --timeout`` (or ``Job.wait(timeout=)``) ran out while the job still runs: the job did not
    fail, so the exit code is 124, ``timeout(1)``'s "timed out", never 1 ("the job failed")."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message, hint, returncode=124)


class EnvironmentDetectionError(TorchHPCError):
    """Inside a job, the distributed environment is inconsistent."""


class DevClusterError(TorchHPCError):
    """The dev cluster cannot be brought up or down."""


class RemoteError(TorchHPCError):
    """``--remote``: the code cannot be shipped, or the other side cannot run the command."""
