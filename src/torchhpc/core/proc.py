"""The one injectable command runner.

Every call to sbatch, squeue, qsub, kubectl, podman, ... goes through a
:class:`Runner`. Errors carry argv, exit code and stderr. Unit tests pass a
fake one (``tests/fakes.py``); integration tests use the real one. Nothing patches
``subprocess`` globally.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from torchhpc.errors import CommandError, CommandNotFound

__all__ = ["Completed", "Runner", "default_runner", "start_early"]

# Commands started before their caller asks (start_early): argv -> the process, taken by the first run() of it.
_EARLY: dict[tuple[str, ...], tuple[subprocess.Popen[str], dict[str, str]]] = {}


@dataclass(frozen=True)
class Completed:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


class Runner:
    """Runs external commands with a timeout; raises :class:`CommandError` on failure."""

    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        timeout: float = 60.0,
        *,
        env_factory: Callable[[], Mapping[str, str] | None] | None = None,
    ) -> None:
        """``env`` replaces ``os.environ`` for every command; ``env_factory`` computes it at the
        first command instead (so rendering and dry runs never probe for a cluster)."""
        self._env = dict(env) if env is not None else None
        self._env_factory = env_factory
        self.timeout = timeout

    @property
    def env(self) -> dict[str, str] | None:
        if self._env_factory is not None:
            factory, self._env_factory = self._env_factory, None
            found = factory()
            self._env = dict(found) if found is not None else None
        return self._env

    @env.setter
    def env(self, value: Mapping[str, str] | None) -> None:
        self._env = dict(value) if value is not None else None
        self._env_factory = None

    def run(
        self,
        argv: Sequence[str],
        *,
        input: str | None = None,
        check: bool = True,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        hint: str | None = None,
        cwd: str | None = None,
    ) -> Completed:
        argv = [str(a) for a in argv]
        merged = dict(os.environ if self.env is None else self.env)
        if env:
            merged.update(env)
        early, early_env = _EARLY.pop(tuple(argv), (None, None))
        if early is not None and (input is not None or cwd is not None or merged != early_env):
            early.kill()  # started for another environment: this run asks again
            early = None
        if early is None and shutil.which(argv[0], path=merged.get("PATH")) is None and not os.path.exists(argv[0]):
            raise CommandNotFound(argv, hint)
        try:
            if early is not None:
                out, err = early.communicate(timeout=timeout or self.timeout)
                cp = subprocess.CompletedProcess(argv, early.returncode, out, err)
            else:
                cp = subprocess.run(argv, input=input, capture_output=True, text=True,
                                    timeout=timeout or self.timeout, env=merged, cwd=cwd)
        except subprocess.TimeoutExpired as e:
            if early is not None:
                early.kill()
            err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
            raise CommandError(argv, None, err, hint) from None
        done = Completed(tuple(argv), cp.returncode, cp.stdout, cp.stderr)
        if check and cp.returncode != 0:
            raise CommandError(argv, cp.returncode, cp.stderr, hint, cp.stdout)
        return done

    def which(self, program: str) -> str | None:
        path = (self.env or os.environ).get("PATH")
        return shutil.which(program, path=path)


def default_runner() -> Runner:
    return Runner()


def start_early(argv: Sequence[str]) -> None:
    """Start ``argv`` now, in this process's environment, for a :meth:`Runner.run` of the same argv to
    take later: a question the command will surely ask (``run -s slurm``: sinfo, for slurm/fits.py) is
    answered while Python imports the rest (~14 ms of a 0.1 s submit). A run with another environment, a
    cwd or input starts its own; a command not found here is left to that run to say so."""
    if tuple(argv) in _EARLY or shutil.which(argv[0]) is None:
        return
    with contextlib.suppress(OSError):
        env = dict(os.environ)
        _EARLY[tuple(argv)] = (subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                                stderr=subprocess.PIPE, text=True, env=env), env)
