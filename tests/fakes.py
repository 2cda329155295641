"""Fakes the tests share: :class:`FakeRunner`, the command runner that answers from a table.

Only tests (and the benchmarks that time code paths without a cluster) use it, so it lives
here rather than in ``torchhpc.core.proc``, beside the real :class:`~torchhpc.core.proc.Runner`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from torchhpc.core.proc import Completed, Runner
from torchhpc.errors import CommandError, CommandNotFound

__all__ = ["FakeRunner", "Responder"]


Responder = Callable[[Sequence[str], "str | None"], "Completed | tuple[int, str, str] | str"]


@dataclass
class FakeRunner(Runner):
    """A runner for unit tests: answers from a table keyed by the program name.

    ``responses["sbatch"] = "Submitted batch job 42\\n"`` or a callable
    ``(argv, input) -> (rc, stdout, stderr)``. Every call is recorded in ``calls``.
    """

    responses: dict[str, object] = field(default_factory=dict)
    calls: list[tuple[list[str], str | None]] = field(default_factory=list)
    present: set[str] | None = None

    def __post_init__(self) -> None:
        super().__init__(env={}, timeout=1)

    def run(  # type: ignore[override]
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
        self.calls.append((argv, input))
        resp = self.responses.get(argv[0])
        if resp is None:
            raise CommandNotFound(argv, hint)
        out = resp(argv, input) if callable(resp) else resp
        if isinstance(out, Completed):
            done = out
        elif isinstance(out, tuple):
            rc, so, se = out
            done = Completed(tuple(argv), int(rc), str(so), str(se))
        else:
            done = Completed(tuple(argv), 0, str(out), "")
        if check and done.returncode != 0:
            raise CommandError(argv, done.returncode, done.stderr, hint, done.stdout)
        return done

    def which(self, program: str) -> str | None:
        if self.present is not None:
            return f"/usr/bin/{program}" if program in self.present else None
        return f"/usr/bin/{program}" if program in self.responses else None
