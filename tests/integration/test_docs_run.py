"""The README and docs/*.md run as written (issue 26, item 5): every command of their sh/bash blocks,
not only the dry runs, on this machine and the real dev cluster.

Which commands run and which are skipped, and why, is stated once in tests/doc_commands.py (rules
on the command's text; a dry run always runs). A runnable command runs as a reader would type it:
``bash -c COMMAND`` in a fresh folder per block holding ``FIXTURES`` and links to the repository's
examples/ and benchmarks/, the venv first on PATH, no torchhpc configuration, a HOME of its own.
Commands of one block run in order (a later line may read what an earlier one wrote); blocks run
side by side. A command that names a job after one of its block submitted one (``Submitted slurm:N``)
names the job the block got, as a reader does: the ids shown in the docs came from another cluster.
Each must exit 0 within its time limit. A submission that returned before its job
ended (an array, a sweep) is then waited for: its tasks must complete too. Last, alone on the
cluster, the commands that measure its links (``EXCLUSIVE``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, missing
from tests.doc_commands import EXCLUSIVE, FIXTURES, LINKED, DocCommand, all_commands

pytestmark = pytest.mark.cluster("slurm")

COMMAND_TIMEOUT = 420.0  # bench nodes on the dev cluster has a 180 s budget of its own, queue included
WAIT_TIMEOUT = 600.0  # for every job submitted without --wait (arrays, sweeps), together
PARALLEL = 4
_HANDLE = re.compile(r"\b(slurm|pbs|local):\d+(?:_\d+)?\b")


VENV_BIN = Path(sys.executable).parent
# A block that activates the venv itself (README: `source .venv/bin/activate`, after ./scripts/setup.sh)
# runs from a PATH without it, and the activation holds for the block's later lines, as in the reader's
# shell. Other lines run on their own: an `export` before a skipped line (docs/scale.md's cluster of its
# own, brought up by a line that does not run here) must not redirect the lines after it.
_SESSION = _ACTIVATE = re.compile(r"^(source|\.) \S*activate\b")


def _env(home: Path, venv_on_path: bool = True) -> dict[str, str]:
    """The reader's environment: their own PATH, and the venv first on it unless the block itself puts it
    there (a block with `source .venv/bin/activate` runs from a PATH without the venv, as after setup.sh)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TORCHHPC_", "SLURM_", "SBATCH_", "PBS_", "VIRTUAL_ENV")) and k != "XDG_CONFIG_HOME"}
    env["HOME"] = str(home)
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and Path(p) != VENV_BIN]
    env["PATH"] = os.pathsep.join([str(VENV_BIN), *path] if venv_on_path else path)
    return env


def _folder(root: Path, block: str) -> Path:
    d = root / re.sub(r"[^A-Za-z0-9]+", "-", block)
    (d / "home").mkdir(parents=True)
    for name, text in FIXTURES.items():
        (d / name).write_text(text)
    for name in LINKED:
        (d / name).symlink_to(REPO / name)
    return d


def _run_block(root: Path, block: str, commands: list[DocCommand]) -> list[tuple[DocCommand, int, str, float]]:
    """The block's commands in order, as one reader's shell: a `source`/`export` line holds for the lines
    after it (each command runs after the block's earlier ones of those)."""
    d = _folder(root, block)
    results = []
    got: dict[str, str] = {}  # scheduler -> the handle this block's last submission printed
    session: list[str] = []
    env = _env(d / "home", venv_on_path=not any(_ACTIVATE.search(c.command) for c in commands))
    for c in commands:
        start = time.monotonic()
        command = _HANDLE.sub(lambda m: got.get(m.group(1), m.group(0)), c.command)
        try:
            done = subprocess.run(["bash", "-c", "\n".join([*session, command])], cwd=d, env=env,
                                  capture_output=True, text=True, timeout=COMMAND_TIMEOUT)
            rc, out = done.returncode, done.stdout + done.stderr
        except subprocess.TimeoutExpired as e:
            partial = b"".join(x if isinstance(x, bytes) else x.encode() for x in (e.stdout, e.stderr) if x)
            rc, out = 124, f"timed out after {COMMAND_TIMEOUT:.0f}s\n" + partial.decode(errors="replace")
        results.append((c, rc, out, time.monotonic() - start))
        if _SESSION.match(c.command) and rc == 0:
            session.append(c.command)
        got.update((m.group(1), m.group(0)) for m in _HANDLE.finditer(" ".join(re.findall(r"Submitted (\S+)", out))))
    return results


def test_readme_quick_tour_runs_line_by_line(slurm_cluster: Any, tmp_path: Path) -> None:
    """Issue 50, item 9: the README's quick tour as a newcomer types it after ./scripts/setup.sh, from a
    shell whose PATH has no .venv/bin until the tour's own `source .venv/bin/activate` puts it there."""
    if not (REPO / ".venv" / "bin" / "activate").exists():
        missing("no .venv in the checkout (./scripts/setup.sh makes it; scripts/test.sh runs it)")
    tour = [c for c in all_commands() if c.block == _quick_tour_block()]
    assert tour and _SESSION.match(tour[0].command), [c.command for c in tour]
    bare = subprocess.run(["bash", "-c", "command -v torchhpc || echo none"], env=_env(tmp_path, False),
                          capture_output=True, text=True, timeout=30).stdout.strip()
    assert bare == "none" or Path(bare).parent != VENV_BIN, f"the test's PATH already has the venv: {bare}"
    # The tour's `slurm:123` lines name the job its `--wait` line submitted, as a reader's would (top: that
    # job has ended by then; tests/integration/test_top_cluster.py runs top on a live one).
    runs = [c for c in tour if not c.skip or (c.skip.startswith("placeholder") and " top " not in f" {c.command}")]
    results = _run_block(tmp_path, "readme-tour", runs)
    failed = [f"{c.where}: `{c.command}` exited {rc}:\n{out[-2000:]}" for c, rc, out, _s in results if rc != 0]
    assert not failed, "\n\n".join(failed)
    assert len(results) >= 9, [c.command for c, *_ in results]


def _quick_tour_block() -> str:
    lines = (REPO / "README.md").read_text().splitlines()
    start = lines.index("## Quick tour")
    first = next(i for i in range(start, len(lines)) if lines[i].startswith("```sh"))
    return f"README.md:{first + 2}"


@pytest.mark.whole_machine  # its blocks run PARALLEL at a time
def test_every_doc_command_runs(slurm_cluster: Any, tmp_path: Path) -> None:
    commands = all_commands()
    runnable = [c for c in commands if not c.skip]
    assert len(runnable) >= 35, "fewer documented commands run than when this test was written: a rule too wide?"
    blocks: dict[str, list[DocCommand]] = defaultdict(list)
    for c in runnable:
        if not EXCLUSIVE.search(c.command):
            blocks[c.block].append(c)
    with ThreadPoolExecutor(max_workers=PARALLEL) as pool:
        results = [r for rs in pool.map(lambda kv: _run_block(tmp_path, *kv), blocks.items()) for r in rs]
    _wait_for_submitted(results, tmp_path)
    alone = [c for c in runnable if EXCLUSIVE.search(c.command)]
    results += _run_block(tmp_path, "exclusive", alone)

    report = [f"ran {len(runnable)}, skipped {len(commands) - len(runnable)}:"]
    report += [f"  {rc:>3} {secs:5.1f}s {c.where}: {c.command[:100]}" for c, rc, _out, secs in results]
    report += [f"  skip {c.where}: {c.skip.split(':')[0]}" for c in commands if c.skip]
    print("\n".join(report))
    failed = [f"{c.where}: `{c.command}` exited {rc}:\n{out[-3000:]}" for c, rc, out, _s in results if rc != 0]
    assert not failed, "\n\n".join(failed)


def _wait_for_submitted(results: list[tuple[DocCommand, int, str, float]], tmp_path: Path) -> None:
    # What was submitted and not waited for must end well too (the docs promise these jobs work);
    # whatever is left when the time is up is cancelled: the dev cluster is shared.
    pending = sorted({h for _c, _rc, out, _s in results for h in re.findall(r"Submitted (slurm:\d+)", out)})
    env = _env(tmp_path)
    deadline = time.monotonic() + WAIT_TIMEOUT
    try:
        for handle in pending:
            left = max(10.0, deadline - time.monotonic())
            done = subprocess.run([sys.executable, "-m", "torchhpc", "wait", handle, "--timeout", f"{left:.0f}"],
                                  env=env, capture_output=True, text=True, timeout=left + 60)
            assert done.returncode == 0, f"{handle}: {done.stdout}{done.stderr}"
    finally:
        for handle in pending:
            subprocess.run([sys.executable, "-m", "torchhpc", "cancel", handle], env=env, capture_output=True,
                           timeout=60)
