"""Each profile's render against its seed's own commands, variable by variable.

The seed documents (shared/seeds/, beside the repository) are read as they are: every
``#SBATCH --key value`` line, every ``export NAME=VALUE``, every ``-x NAME[=VALUE]`` (mpirun)
and ``-e NAME=VALUE`` (runai) in the lines of the seed's example job. Each must appear in the
profile's golden render (tests/golden/profiles/NAME.txt, itself checked against the renderer)
with the same value, or be listed with its reason in docs/profiles.md's table "Checked against
the seeds, variable by variable". A listed item that the render does match is an error too, so
the table never goes stale.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.conftest import REPO, missing

# Beside the clone in CI (REPO/../shared/seeds); $TORCHHPC_SEEDS names another place.
SEEDS = Path(os.environ.get("TORCHHPC_SEEDS") or REPO.parent / "shared" / "seeds")
GOLDEN = REPO / "tests" / "golden" / "profiles"
DOC = REPO / "docs" / "profiles.md"

# profile -> (seed file prefix, the line range of the seed's example job, 1-based inclusive)
JOBS: dict[str, tuple[str, int, int]] = {
    "mn5": ("000", 95, 112),  # "Batched execution w/ Singularity": the #SBATCH block and srun
    "lumi": ("002", 230, 315),  # the runscript's exports and mnist.slurm
    "sockeye": ("003", 64, 77),  # `mpirun + python`: the -x variables
    "alliance-cc": ("003", 86, 95),  # `srun + torchrun`
    "rcp": ("004", 60, 125),  # RCP_run_app.sh's exports and the runai command
}


def seed_lines(profile: str) -> list[str]:
    prefix, first, last = JOBS[profile]
    found = sorted(SEEDS.glob(f"{prefix}_*.txt")) if SEEDS.is_dir() else []
    if not found:
        missing("shared/seeds not beside the repository (CI has it beside the clone)")
    return found[0].read_text().splitlines()[first - 1 : last]


def seed_items(profile: str) -> dict[str, str]:
    """``#SBATCH --key`` / ``NAME`` -> the seed's value (the first one: later lines are alternatives)."""
    items: dict[str, str] = {}
    for line in seed_lines(profile):
        s = line.strip()
        m = re.match(r"#SBATCH\s+--([\w-]+)(?:[ =]\s*(\S+))?", s)
        if m:
            items.setdefault(f"#SBATCH --{m.group(1)}", (m.group(2) or "").strip('"'))
            continue
        for m in re.finditer(r"(?:^export\s+|(?:^|\s)-[xe]\s+)([A-Z_][A-Z0-9_]*)(?:=(\S+))?", s):
            items.setdefault(m.group(1), m.group(2) or "")
    return items


def rendered(profile: str, item: str, value: str) -> bool:
    """Does the golden render set ``item`` to the seed's ``value``?"""
    text = (GOLDEN / f"{profile}.txt").read_text()
    text += "\n" + re.sub(r"\\(.)", r"\1", text)  # RunAI's second quoting layer undone
    if item.startswith("#SBATCH "):
        return f"{item}={value}" in text if value else re.search(rf"^{re.escape(item)}\b", text, re.M) is not None
    if not value:  # `-x PATH`: passed on
        return re.search(rf"(?:-x|-e|--env) {re.escape(item)}\b", text) is not None
    return re.search(rf"(?<![\w]){re.escape(item)}={re.escape(value)}(?![^\s'\"])", text) is not None


def documented() -> dict[str, dict[str, str]]:
    """docs/profiles.md's checked table: profile -> item -> why."""
    out: dict[str, dict[str, str]] = {}
    text = DOC.read_text()
    start = text.index("## Checked against the seeds, variable by variable")
    for line in text[start:].splitlines()[1:]:
        if line.startswith("## "):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("| ") else []
        if len(cells) >= 4 and cells[0] != "profile" and not cells[0].startswith("-"):
            item = cells[1].strip("`")
            out.setdefault(cells[0], {})[item] = cells[3]
    return out


@pytest.mark.parametrize("profile", sorted(JOBS))
def test_every_seed_variable_is_rendered_or_explained(profile: str) -> None:
    items = seed_items(profile)
    assert items or profile == "alliance-cc", f"no variables read from the seed for {profile}"
    differ = {k for k, v in items.items() if not rendered(profile, k, v)}
    listed = documented().get(profile, {})
    assert not differ - set(listed), f"{profile}: differs from the seed, not explained in docs/profiles.md: {sorted(differ - set(listed))}"
    stale = set(listed) - differ
    assert not stale, f"{profile}: docs/profiles.md lists as different what the render has (or the seed lacks): {sorted(stale)}"
    assert all(len(why) > 10 for why in listed.values()), f"{profile}: a difference without its reason"


def test_the_parser_reads_the_seeds_variables() -> None:
    """What the checks stand on: the known lines of the seeds are found, with their values."""
    assert seed_items("lumi")["NCCL_SOCKET_IFNAME"] == "hsn0,hsn1,hsn2,hsn3"  # not the later alternative "hsn"
    assert seed_items("lumi")["#SBATCH --mem"] == "480G"
    assert seed_items("mn5")["#SBATCH --cpus-per-task"] == "80"
    assert seed_items("rcp")["NCCL_IB_HCA"] == "mlx5"
    assert seed_items("sockeye")["CUDA_VISIBLE_DEVICES"] == "0,1,2,3" and seed_items("sockeye")["PATH"] == ""
    assert rendered("lumi", "NCCL_NET_GDR_LEVEL", "3") and not rendered("lumi", "NCCL_NET_GDR_LEVEL", "4")
