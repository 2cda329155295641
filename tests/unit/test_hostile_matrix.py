"""Issue 20's hostile matrix, reduced for CI (the full one: benchmarks/hostile_audit.py).

Every corpus string (tests/data/hostile/corpus.json, 290 of them) goes through two
(setup, field) pairs of one scheduler kind (string i: kind i % 5), and the two CORE strings -- a trailing newline, ``#PBS``/
``#SBATCH`` line starts, a command in ``$(...)`` and on its own line, quotes, ``%`` and
``../``; and ``--privileged`` -- through every field of every renderer (local, slurm x 3
launchers, pbs x 2, kubernetes, runai, each container runtime). See tests/hostile.py for
what runs for real (bash, sbatch's parser, PyYAML, shellcheck) and what is a stub.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import missing
from tests.hostile import CORE, SETUPS, corpus, reduced_pick, run_matrix

KINDS = ("local", "slurm", "pbs", "kubernetes", "runai")


@pytest.mark.slow  # minutes: every hostile value through every render and a real shell (the full suite runs it)
@pytest.mark.parametrize("kind", KINDS)
def test_hostile_matrix(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A relative value (--output-dir q7ph) resolves against the working directory, and the rendered
    # scripts really run: from the repository root they once left q7ph/train-42/ranks/ in a commit.
    monkeypatch.chdir(tmp_path)
    for tool in ("sbatch", "shellcheck"):
        if not shutil.which(tool):
            missing(f"{tool} is not installed: the hostile matrix needs its parser")
    values = corpus()
    assert len(values) >= 250 and all(c in values for c in CORE)
    setups = [s for s in SETUPS if s.kind == kind]
    counts = run_matrix(
        values, tmp_path, setups=setups, pick=reduced_pick(values, setups, share=(KINDS.index(kind), len(KINDS))),
        sbatch_every=2, shellcheck_every=1,
    )
    print(counts.line())
    assert counts.executed > 20, counts.line()
    problems = (counts.injections, counts.argv_mismatches, counts.tracebacks, counts.bad_errors,
                counts.sbatch_mismatches, counts.shellcheck_findings)
    assert problems == (0, 0, 0, 0, 0, 0), counts.line() + "\n" + "\n".join(counts.failures[:30])
    if kind == "slurm":
        assert counts.sbatch_checked > 20
    if kind in ("slurm", "pbs", "local", "runai"):
        assert counts.shellcheck_scripts > 10


def test_corpus_covers_the_issue() -> None:
    values = corpus()
    for needle in ("\n", "\r", "#PBS", "#SBATCH", "'", "%", "../", "\x00", "$(touch CANARY)", "`touch CANARY`"):
        assert any(needle in v for v in values), needle
    assert any(v.startswith("-") for v in values)
    assert any(v.endswith("\n") and not v.endswith("\n\n") for v in values)
    assert any(any(0xD800 <= ord(c) <= 0xDFFF for c in v) for v in values)
    assert any(len(v) >= 100_000 for v in values)
