"""The job record: what torchhpc remembers about a submitted job, so ``logs``/``status`` need only its id.

One typed record (:class:`JobRecord`), read and written here and nowhere else, one JSON file per
job under the state directory (``$TORCHHPC_STATE_DIR``, default ``~/.cache/torchhpc``)::

    jobs/<scheduler>-<job id>.json

The file keeps the flat JSON object earlier versions wrote (same keys, plus ``schema``), so a
record written before the schema existed reads as schema 1, and an older torchhpc still reads a
new one. Keys this version does not know are kept in :attr:`JobRecord.extra` and written back.
A record is a courtesy: a read-only state directory must never fail a submission, and an
unreadable file reads as no record.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import MISSING, Field, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Optional

from torchhpc.jobdir.layout import read_json

__all__ = [
    "SCHEMA", "JobRecord", "dependency_record", "forget_record", "load_record", "new_record", "newest_record", "read_record",
    "record_dir", "record_path", "save_record", "update_record",
]

# The version of the record's layout. 1: the flat object of torchhpc <= 0.x (no "schema" key).
SCHEMA = 1


@dataclass(frozen=True)
class JobRecord:
    """What one submitted job needs later. Empty values mean "not known for this scheduler"."""

    scheduler: str
    job_id: str
    submitted: float = 0.0
    schema: int = SCHEMA
    name: str = ""
    # the launcher's name ("srun", "mpirun", "torchrun"), or "local": how its output lines are tagged
    launcher: str = ""
    nproc_per_node: int = 1
    nodes: int = 1
    # the batch script, and where its output goes: Slurm's --output pattern (%x, %j) or the file itself
    script: str = ""
    output: str = ""
    output_path: str = ""
    # PBS: qsub's -o directory (the file is <name>.o<seq> inside it)
    output_dir: str = ""
    # the job's directory (<output-dir>/<name>-<id>/, with ranks/ for per-rank files)
    job_dir: str = ""
    # a Slurm array: its tasks' directories are <output-dir>/<name>-ARRAY_TASK
    array: bool = False
    # Kubernetes: namespace and how to reach the API; RunAI: the project
    namespace: str = ""
    options: dict[str, str] = field(default_factory=dict)
    project: str = ""
    # who cancelled the job through torchhpc (`cancel`, the hang watch), and when: "root at 03:52:10" (Slurm's
    # controller does not say; its accounting keeps a uid only)
    cancelled: str = ""
    # keys this version does not know (a newer torchhpc's): kept, written back unchanged
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobRecord:
        """A record as any version wrote it: unknown keys to :attr:`extra`, values to their field's type."""
        known = {f.name: f for f in fields(cls) if f.name != "extra"}
        values = {k: _typed(k, v, _default(known[k])) for k, v in data.items() if k in known}
        extra = {k: v for k, v in data.items() if k not in known}
        return cls(**{"scheduler": "", "job_id": "", **values}, extra=extra)

    def to_json(self) -> dict[str, Any]:
        """The flat object of the file: identity and schema always, other fields when they say something."""
        out: dict[str, Any] = {"scheduler": self.scheduler, "job_id": self.job_id, "submitted": self.submitted,
                               "schema": self.schema}
        for f in fields(self):
            if f.name in out or f.name == "extra":
                continue
            value = getattr(self, f.name)
            if value not in ("", {}, False) and not (f.name in ("nproc_per_node", "nodes") and value == 1):
                out[f.name] = value
        return {**self.extra, **out}

    def with_(self, **changes: Any) -> JobRecord:
        return replace(self, **changes)


def _default(f: Field[Any]) -> Any:
    if f.default is not MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not MISSING else ""


def _typed(key: str, value: Any, default: Any) -> Any:
    """``value`` as the field's type: records were written by hand-rolled dicts (``"2"`` for 2)."""
    if isinstance(default, bool):
        return bool(value)
    if isinstance(default, (int, float)):
        try:
            return type(default)(str(value))
        except ValueError:
            return default
    if key == "options":
        return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}
    return "" if value is None else str(value)


def record_dir() -> Path:
    base = os.environ.get("TORCHHPC_STATE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "torchhpc"
    )
    return Path(base) / "jobs"


def record_path(scheduler: str, job_id: str) -> Path:
    return record_dir() / f"{scheduler}-{job_id}.json"


def save_record(record: JobRecord) -> None:
    """Write the record (a read-only home must not fail a submission)."""
    with contextlib.suppress(OSError):
        path = record_path(record.scheduler, record.job_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record.to_json(), indent=1))


def load_record(scheduler: str, job_id: str) -> Optional[JobRecord]:
    """The job's record, or None: never written, removed, or not readable as a record."""
    data = read_json(record_path(scheduler, job_id))
    if not isinstance(data, dict):
        return None
    return JobRecord.from_json({"scheduler": scheduler, "job_id": job_id, **data})


def newest_record(scheduler: str) -> Optional[JobRecord]:
    """The record of the ``scheduler`` job submitted last from here (``list --last``: the queue forgets a job that
    ended, this store does not), None when there is none."""
    prefix = f"{scheduler}-"
    found = [r for p in record_dir().glob(f"{prefix}*.json") for r in [load_record(scheduler, p.stem[len(prefix):])] if r]
    return max(found, key=lambda r: r.submitted, default=None)


def read_record(scheduler: str, job_id: str) -> JobRecord:
    """The job's record, or an empty one (every field its default) when there is none."""
    return load_record(scheduler, job_id) or JobRecord(scheduler=scheduler, job_id=job_id)


def new_record(scheduler: str, job_id: str, **values: Any) -> JobRecord:
    """A record for a job submitted now; values that are no field of :class:`JobRecord` (a backend's
    own facts, e.g. Kubernetes' ``api``, RunAI's ``cli``) go to :attr:`JobRecord.extra`."""
    known = {f.name for f in fields(JobRecord)} - {"extra"}
    own = {k: v for k, v in values.items() if k in known}
    extra = {**values.get("extra", {}), **{k: v for k, v in values.items() if k not in known and k != "extra"}}
    return JobRecord(scheduler=scheduler, job_id=job_id, submitted=time.time(), **own, extra=extra)


def dependency_record(spec: Any) -> dict[str, Any]:
    """The job's dependencies for its record (``after``: ``[[kind, job id], ...]``, kept in
    :attr:`JobRecord.extra`), so that ``status`` can say what a waiting job waits for."""
    return {"after": [[d.kind, d.job_id] for d in spec.after]} if getattr(spec, "after", ()) else {}


def forget_record(scheduler: str, job_id: str) -> None:
    """Remove the job's record (``torchhpc list --prune``); none is no error."""
    record_path(scheduler, job_id).unlink(missing_ok=True)


def update_record(scheduler: str, job_id: str, **changes: Any) -> None:
    """Add ``changes`` to the job's record once more is known (its directory, once the id is)."""
    rec = load_record(scheduler, job_id) or new_record(scheduler, job_id)
    save_record(rec.with_(**changes))
