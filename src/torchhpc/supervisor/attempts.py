"""``<job dir>/attempts.json``: one object per attempt of the launch, appended as they end.

A JSON list; each object holds ``attempt`` (0, 1, ...), ``nodes`` (the step's nodes),
``class`` (the verdict's class, ``null`` for a success), ``excluded`` (nodes excluded after it),
``started`` and ``ended`` (epoch seconds), ``exit_code``, ``rank`` and ``detail`` (the first
failed rank and its error line, when known), ``found_by`` (how the supervisor learnt of the
failure: ``probe``, its liveness check of the step's nodes, which stops the step itself;
``hang-watch``; ``step-end``, the step ended by itself; ``""`` for a success). A requeued job appends to the same file, so the
list is the job's whole history and ``TORCHHPC_RESTART_COUNT`` is its length so far.

The parts of a recovery (``torchhpc events`` reads them; all optional, ``null`` when not known;
times in epoch seconds, durations in seconds):

* ``launched``: when this attempt's step was started (after the health gate);
* ``first_line``: when a rank of this attempt wrote its first output line;
* ``fault``: when the supervisor detected the failure; ``found_by``: how (``"probe"``: a node
  stopped answering, ``"step-end"``: the step ended by itself, ``"hang-watch"``: the hang watch);
* ``teardown_s``: from the detection until the step was gone;
* ``health_s`` and ``health``: how long the health gate before this attempt took, and
  ``{node: reason}`` for the nodes it failed (excluded like dead ones);
* ``checkpoint_step``: the newest checkpoint's step seen at the attempt's end (``null``: none);
* ``probe_s``: the supervisor's probe interval, the bound on the detection of a fault it found;
* ``world_size``: the attempt's ranks (its nodes times the ranks per node): fewer than the job asked for
  after a shrink (``--min-nodes``).

The last attempt's ``class`` is the job's: after a restart storm it is ``no-progress`` (the job ended
because no attempt advanced the checkpoint), its ``cause`` is how that attempt itself ended (``hang``)
and its ``detail`` the supervisor's words ("restart storm: hang x3 before the first checkpoint, ...").
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from torchhpc.jobdir.attempts import load_attempts, save_attempts

__all__ = ["Attempt", "load_attempts", "save_attempts", "storm"]



@dataclass
class Attempt:
    attempt: int
    nodes: list[str]
    started: float
    ended: Optional[float] = None
    klass: Optional[str] = None
    excluded: list[str] = field(default_factory=list)
    exit_code: Optional[int] = None
    rank: Optional[int] = None
    detail: str = ""
    job_id: str = ""  # the scheduler's id of the job the attempt ran in (``slurm_job`` in older files)
    launched: Optional[float] = None
    first_line: Optional[float] = None
    fault: Optional[float] = None
    found_by: str = ""
    teardown_s: Optional[float] = None
    health_s: Optional[float] = None
    health: dict[str, str] = field(default_factory=dict)
    checkpoint_step: Optional[int] = None
    cause: Optional[str] = None  # the attempt's own class where the job's end replaced it (see storm())
    probe_s: Optional[float] = None  # the supervisor's probe interval: a fault it found happened at most this long before
    world_size: Optional[int] = None  # the attempt's ranks: fewer than the job's after a shrink (--min-nodes)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["class"] = d.pop("klass")
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Attempt:
        d = dict(d)
        d["klass"] = d.pop("class", None)
        d.setdefault("job_id", d.pop("slurm_job", ""))  # attempts.json written before the rename
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in known})


def storm(job_dir: str, history: list[dict[str, Any]], words: str) -> None:
    """The no-progress stop, recorded: the last attempt's class becomes ``no-progress`` (its own class
    kept as ``cause``) and ``words`` its detail, so attempts.json ends with the class the job ended with."""
    if not history:
        return
    last = history[-1]
    last["cause"], last["class"], last["detail"] = last.get("class"), "no-progress", words[:300]
    save_attempts(job_dir, history)
