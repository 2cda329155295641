"""The typed job record (issue 25 item 5): one module reads and writes it, with a schema version,
and records written before it existed still read.

tests/data/records/ holds files written by the record store as it was before this module
(``schedulers/batch/script.py``'s ``save_record``/``update_record``, called with the exact fields each
backend passed); they must read back field for field, and an older torchhpc must still find its
keys in a record this version writes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import REPO
from torchhpc.jobdir.logs import job_log, task_record
from torchhpc.jobdir.record import (
    SCHEMA,
    JobRecord,
    load_record,
    new_record,
    read_record,
    record_dir,
    save_record,
    update_record,
)

OLD = REPO / "tests" / "data" / "records"


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TORCHHPC_STATE_DIR", str(tmp_path))
    d = record_dir()
    d.mkdir(parents=True)
    for f in OLD.glob("*.json"):
        shutil.copy(f, d / f.name)
    return d


def test_records_of_the_previous_version_read_field_for_field(state: Path) -> None:
    slurm = load_record("slurm", "4242")
    assert slurm is not None and slurm.schema == SCHEMA == 1
    assert (slurm.launcher, slurm.nproc_per_node, slurm.name, slurm.output) == ("torchrun", 4, "pi", "/scratch/out/%x-%j.out")
    assert (slurm.job_dir, slurm.output_path) == ("/scratch/out/pi-4242", "/scratch/out/pi-4242/slurm.out")
    assert slurm.script == "/scratch/out/pi-4242/job.sbatch" and slurm.submitted > 0 and slurm.extra == {}
    pbs = read_record("pbs", "12.server")
    assert (pbs.output_dir, pbs.name, pbs.launcher) == ("/scratch/out", "pi", "mpirun")
    kube = read_record("kubernetes", "pi-abc")
    assert (kube.namespace, kube.nodes, kube.nproc_per_node) == ("ml", 2, 8)
    assert kube.options == {"transport": "api", "api_server": "https://k8s.example:6443"}
    runai = read_record("runai", "pi")
    assert (runai.project, runai.nproc_per_node, runai.nodes) == ("team-a", 4, 2)  # "4" was written as a string
    assert read_record("local", "a1b2").launcher == "local"


def test_what_logs_reads_from_an_old_record(state: Path) -> None:
    log = job_log("slurm", "4242")
    assert log is not None
    assert (log.output, log.ranks_dir, log.launcher, log.nproc_per_node) == (
        "/scratch/out/pi-4242/slurm.out", "/scratch/out/pi-4242/ranks", "torchrun", 4)
    # an array task falls back to its array's record, with the task's own directory
    task = task_record("slurm", "77_3")
    assert task.array and task.job_dir == "/scratch/out/sweep-77_3" and task.launcher == "srun"


def test_written_records_keep_the_old_keys_and_unknown_ones(state: Path) -> None:
    """An older torchhpc reads the same flat keys; keys of a newer one survive a rewrite."""
    raw = json.loads((state / "slurm-4242.json").read_text())
    raw["future_field"] = {"x": 1}
    (state / "slurm-4242.json").write_text(json.dumps(raw))
    update_record("slurm", "4242", job_dir="/elsewhere")
    again = json.loads((state / "slurm-4242.json").read_text())
    assert again["future_field"] == {"x": 1} and again["schema"] == SCHEMA and again["job_dir"] == "/elsewhere"
    for key in ("launcher", "nproc_per_node", "name", "output", "output_path", "script", "submitted"):
        assert again[key] == raw[key], key


def test_round_trip_and_missing_or_broken_files(state: Path) -> None:
    rec = new_record("pbs", "9.s", launcher="mpirun", nproc_per_node=3, name="x", output_dir="/o")
    save_record(rec)
    assert load_record("pbs", "9.s") == rec
    assert load_record("pbs", "nope") is None and read_record("pbs", "nope") == JobRecord("pbs", "nope")
    (state / "slurm-5.json").write_text("[1, 2]")
    (state / "slurm-6.json").write_text("{not json")
    assert load_record("slurm", "5") is None and load_record("slurm", "6") is None


def test_one_module_reads_and_writes_records() -> None:
    """No other module opens a record file or builds one as a dict."""
    src = REPO / "src" / "torchhpc"
    offenders = [
        str(p.relative_to(src))
        for p in src.rglob("*.py")
        if p.name != "record.py" and ("record_path(" in p.read_text() or '-{job_id}.json' in p.read_text())
    ]
    assert offenders == []
