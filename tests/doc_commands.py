"""Every command of README.md and docs/*.md, and the stated rule that runs or skips each one.

A command is a line of a ```sh/```bash block (```console: its ``$ `` lines), a trailing ``\\``
joining the next line (tests/unit/test_docs.py's ``shell_commands``). Each one RUNS, as written,
from a fresh folder that holds what the docs presume a reader has (``FIXTURES``: ``train.py``
and ``requirements.txt`` stand for the reader's own; ``examples/`` and ``benchmarks/`` are the
repository's), with nothing but the venv on PATH and no torchhpc configuration; Slurm commands
reach the dev cluster, as they do on a machine without Slurm of its own. Or it matches one of
``SKIPS``, first match wins, each with the reason why it cannot run here. The rules are
patterns on the command, so a new command in the docs runs unless a rule says otherwise.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import REPO

DOC_FILES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

# What the docs presume the reader has, beside the repository's examples/ and benchmarks/.
FIXTURES = {
    "train.py": (
        '"""Stands for the reader\'s train.py in the docs: says who it is and what it got, exits 0."""\n'
        "import os, sys\n"
        "print(f\"train.py rank {os.environ.get('RANK', '?')} of {os.environ.get('WORLD_SIZE', '?')} "
        "args {sys.argv[1:]}\", flush=True)\n"
    ),
    "requirements.txt": "# the reader's own requirements (none here)\n",
}
LINKED = ("examples", "benchmarks", ".venv")  # .venv: the README's `source .venv/bin/activate`

# (rule, pattern searched in the command, why it does not run here). First match wins.
SKIPS: list[tuple[str, str, str]] = [
    ("elided", "", "an elided command: `...` stands for the flags shown above"),  # a word of the command
    ("machine", r"^sudo |devcluster (up|down|degrade|restore)\b|scripts/(setup|test|soak)\.sh|\.ci/",
     "sets up or changes the machine or the shared dev cluster (CI runs these steps itself, before the tests)"),
    ("remote", r"--remote me@login\.site\b",
     "logs into a site's login node over ssh; tests/integration/test_remote.py runs these commands against the "
     "dev cluster's login node"),
    ("placeholder", r"slurm:(123|1|29)(_\d+)?\b|\b29_1\b|\bsweep report DIR\b",
     "names a job id or folder that the reader got from an earlier submission"),
    ("gpu", r"--gpus?(-per-node)?[ =]\d|bench gpu|doctor --gpu|CUDA_VISIBLE_DEVICES|benchmarks/(gpu_training|training_table)",
     "needs a GPU (none here); their --dry-run forms run"),
    ("rdma", r"/sys/class/infiniband", "needs an InfiniBand/RoCE adapter (none here)"),
    ("docker", r"docker build|container convert mn5", "needs docker and the NGC-based image mn5 built in the line above"),
    ("test-image", r"TORCHHPC_TEST_(PODMAN|CH)_IMAGE",
     "needs the container test image (.ci/build-test-image.sh); tests/integration/test_containers_slurm.py "
     "runs these commands"),
    ("site", r"--partition acc|--nodelist 'gpu\[|\bsalloc -N 8\b", "a site's partition, account or node names"),
    ("degraded", r"--exclude @bad\.txt|--exclude-file bad\.txt",
     "finds, or reads, the node slowed by `devcluster degrade` (not run: the dev cluster is shared); the same "
     "bench nodes run without it, on the dev cluster, is the line above"),
    ("big", r"-N 16 |--nodes (16|32)|TORCHHPC_SCALE_NODES=32|start_scaling\.py|-e 1G -f 2$",
     "needs a 16- or 32-node cluster of its own, or minutes per size on CPU ranks (1 GiB messages)"),
    ("after-big", r"bench report sweep/", "reads the results of the 1 GiB sweep above (skipped)"),
]
# Commands that measure the cluster's links: they run last, alone, once every other job of the test
# has ended (beside them, a pair of busy nodes reads SLOW, which is what the command is meant to find).
EXCLUSIVE = re.compile(r"bench nodes --scheduler slurm")
# A block that starts like this is a script shown, not commands to type.
EXCERPT = re.compile(r"^(#!|#SBATCH|#PBS)")
_FENCE = re.compile(r"^```(sh|bash|console)\n(.*?)^```", re.S | re.M)


@dataclass(frozen=True)
class DocCommand:
    where: str  # file:line
    block: str  # file:line of the block's first line
    command: str
    skip: str  # "" (runs) or "rule: reason"


def _lines(body: str, console: bool, first: int) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for i, line in enumerate(body.splitlines()):
        if pending is not None:
            start, line = pending[0], f"{pending[1]} {line.strip()}"
        elif console and not line.startswith("$ "):
            continue
        else:
            start, line = first + i, line[2:] if console else line
        if line.rstrip().endswith("\\"):
            pending = (start, line.rstrip()[:-1].rstrip())
            continue
        pending = None
        out.append((start, line))
    return out


def _words(command: str) -> list[str]:
    try:
        return shlex.split(command, comments=True)
    except ValueError:  # bash syntax shlex does not know: the line as it is
        return command.split()


def skip_reason(command: str) -> str:
    """"" when the command runs here, else "rule: reason". A dry run always runs (it renders GPU, site
    and PBS jobs without them), unless it is elided."""
    words = _words(command)
    if "..." in words:
        return f"{SKIPS[0][0]}: {SKIPS[0][2]}"
    if "--dry-run" in words:
        return ""
    for rule, pattern, reason in SKIPS[1:]:
        if re.search(pattern, command):
            return f"{rule}: {reason}"
    return ""


def doc_commands(path: Path) -> list[DocCommand]:
    text = path.read_text()
    name = str(path.relative_to(REPO))
    out: list[DocCommand] = []
    for m in _FENCE.finditer(text):
        first = text.count("\n", 0, m.start(2)) + 1
        if EXCERPT.match(m.group(2)):  # one entry for the whole block
            out.append(DocCommand(f"{name}:{first}", f"{name}:{first}", m.group(2).splitlines()[0],
                                  "excerpt: a generated script shown, not a command to type"))
            continue
        for lineno, line in _lines(m.group(2), m.group(1) == "console", first):
            bare = line.strip()
            if not bare or bare.startswith("#"):
                continue  # a comment line, or the gap between commands
            out.append(DocCommand(f"{name}:{lineno}", f"{name}:{first}", bare, skip_reason(bare)))
    return out


def all_commands() -> list[DocCommand]:
    return [c for path in DOC_FILES for c in doc_commands(path)]
