"""Job dependencies: "start this job after those", as data every backend renders its own way.

``--after-ok 123`` (alias ``--after``), ``--after-any`` and ``--after-fail`` name jobs of the
same scheduler, by bare id or by handle (``slurm:123``). A handle of another scheduler is
refused where the spec is built: no scheduler can wait for another's jobs. Slurm renders
``--dependency=afterok:1:2,afterany:3``, PBS ``-W depend=afterok:1:2,afterany:3`` (the two share
the vocabulary), the local supervisor waits itself (:func:`verdict` is its rule, the same one
the status line uses).

Why a verdict of ``never``: a job after a failed job under ``--after-ok`` can never start. Slurm
would leave it PENDING with the reason DependencyNeverSatisfied forever; torchhpc asks Slurm to
end it instead (``--kill-on-invalid-dep=yes``), and status says which dependency failed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, Optional

from torchhpc.core.handle import Handle, split_handle
from torchhpc.errors import SpecError

__all__ = ["KINDS", "Dependency", "dependency_value", "parse_dependencies", "verdict"]

Kind = Literal["ok", "any", "fail"]
# kind -> (the flag, the word of Slurm's --dependency and PBS's -W depend=)
KINDS: dict[str, tuple[str, str]] = {
    "ok": ("--after-ok", "afterok"),
    "any": ("--after-any", "afterany"),
    "fail": ("--after-fail", "afternotok"),
}
# A job id as schedulers print them: 123, 123_4 (a Slurm array task), 123.server, 123[].server, a local hex id.
# ``<step>``: a pipeline step not submitted yet, only in a pipeline's dry run (the id it will get).
_JOB_ID = r"[A-Za-z0-9][A-Za-z0-9_.\[\]-]*|<[A-Za-z0-9_.-]+>"  # patterns as text: re compiles (and caches) on use
_SUCCESS = "COMPLETED"
# Slurm's and PBS's own --dependency words: typed to --after-ok they are not job ids nor a scheduler's name.
_NATIVE = r"(?i)(after|afterok|afterany|afternotok|aftercorr|afterburstbuffer|singleton|before\w*|on)(?::(.*))?"


def _native_syntax(flag: str, word: str) -> SpecError | None:
    """``afterok:1`` given to a flag: the error that says which flag and id mean it (None: not that syntax)."""
    m = re.fullmatch(_NATIVE, word)
    if m is None:
        return None
    native = m.group(1).lower()
    ids = [i for i in re.split(r"[:?,+]", m.group(2) or "") if re.fullmatch(_JOB_ID, i) and not re.fullmatch(_NATIVE, i)]
    flags = {w: f for f, w in KINDS.values()}
    wanted = flags.get(native, flag)
    example = f"{wanted} {','.join(ids) or 'JOB_ID'}"
    if native in flags:
        hint = f"give the job id itself: {example}"
    else:
        hint = f"torchhpc has no {native!r} dependency: give the id of the job to wait for, e.g. {flag} 123"
    return SpecError(f"{flag} {word}: that is Slurm's --dependency syntax, not a job id", hint)


@dataclass(frozen=True)
class Dependency:
    """Start after job ``job_id`` ended (``any``), ended well (``ok``) or ended badly (``fail``).

    ``scheduler`` is the one named in a handle (``slurm:123``), "" for a bare id.
    """

    kind: Kind
    job_id: str
    scheduler: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise SpecError(f"dependency kind {self.kind!r} is not one of: {', '.join(KINDS)}")
        if not re.fullmatch(_JOB_ID, self.job_id):
            raise SpecError(
                f"{self.flag} {self.job_id!r} is not a job id",
                "give the id a submission printed (123, or a handle such as slurm:123), comma-separated for several",
            )

    @property
    def flag(self) -> str:
        return KINDS[self.kind][0]

    def handle(self, scheduler: str) -> str:
        return str(Handle(self.scheduler or scheduler, self.job_id))


def parse_dependencies(kind: Kind, given: object, scheduler: str, known: Iterable[str] = ()) -> tuple[Dependency, ...]:
    """``"1,2"``, ``["slurm:1", 2]`` or handles (anything whose ``str`` is ``SCHEDULER:ID``) -> dependencies.

    A handle of another scheduler than ``scheduler``, or of none in ``known`` (when given), is refused in one line.
    """
    known = tuple(known)
    if given is None or given == "" or given == []:
        return ()
    items: Iterable[object] = [given] if isinstance(given, (str, int)) or not isinstance(given, Iterable) else given
    out: list[Dependency] = []
    flag = KINDS[kind][0] if kind in KINDS else kind
    for item in items:
        for word in str(item).split(","):
            word = word.strip()
            if not word:
                continue
            native = _native_syntax(flag, word)
            if native is not None:
                raise native
            name, job_id = split_handle(word)
            sep = bool(name)
            if job_id.startswith("<"):  # a pipeline's dry-run placeholder, never a job a user can name
                raise SpecError(f"{flag} {word!r} is not a job id", "give the id a submission printed (123 or slurm:123)")
            if sep and known and name not in known:
                raise SpecError(f"{flag} {word}: {name!r} is not a scheduler (known: {', '.join(known)})",
                                f"give the job id alone ({flag} {job_id}) or as SCHEDULER:ID, e.g. {Handle('slurm', job_id)}")
            if sep and name != scheduler:
                raise SpecError(
                    f"{flag} {word}: a {name} job cannot be a dependency of a {scheduler} job",
                    f"a job waits only for jobs of its own scheduler: give {name}:ID jobs to a --scheduler {name} "
                    f"job, or {scheduler} job ids here",
                )
            out.append(Dependency(kind, job_id, name))  # type: ignore[arg-type]
    return tuple(out)


def dependency_value(deps: Sequence[Dependency]) -> str:
    """Slurm's ``--dependency`` and PBS's ``depend=`` value: ``afterok:1:2,afterany:3`` (all must hold)."""
    parts = []
    for kind, (_flag, word) in KINDS.items():
        ids = [d.job_id for d in deps if d.kind == kind]
        if ids:
            parts.append(":".join([word, *dict.fromkeys(ids)]))
    return ",".join(parts)


def verdict(dep: Dependency, state: Optional[str], exit_code: Optional[int] = None, *, ended: bool) -> str:
    """``"waiting"``, ``"satisfied"`` or ``"never"`` for a dependency whose job is in ``state``
    (Slurm's vocabulary; None: not known yet) and has ``ended`` or not. A job that never ran
    (cancelled by its own dependency) has ended badly: after-fail and after-any jobs still start
    after it, as on Slurm."""
    if state is None or not ended:
        return "waiting"
    ok = state == _SUCCESS and exit_code in (0, None)
    if dep.kind == "any" or (dep.kind == "ok") == ok:
        return "satisfied"
    return "never"
