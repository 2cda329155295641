"""The full hostile-input audit of issue 20: every corpus string through every field of every renderer.

    python benchmarks/hostile_audit.py [--jobs 2] [--budget 0] [--values N] [--sbatch-every 1]

CI runs a reduced matrix (tests/unit/test_hostile_matrix.py); this runs all of it:
tests/data/hostile/corpus.json (291 strings) x every applicable (setup, field) pair of
tests/hostile.py (local, slurm x 3 launchers, pbs x 2, kubernetes, runai, slurm with each
container runtime, local with podman/apptainer). Each rendered script runs through a real
bash with stub commands; Slurm scripts are read by the real sbatch; every script is
linted by shellcheck for the codes issue 20 forbids. It prints the counts -- cases,
refusals, executions, injections, argv mismatches, tracebacks -- and exits 1 when any
problem count is not 0. ``--budget SECONDS`` stops starting new pairs after that long
(pairs run in a fixed shuffled order, so a partial run is a spread sample; the counts
say how many pairs ran). Expect tens of minutes on two shared cores.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import fields
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.hostile import FIELDS, SETUPS, Counts, corpus, pairs, run_matrix

PROBLEMS = ("injections", "argv_mismatches", "tracebacks", "bad_errors", "sbatch_mismatches", "shellcheck_findings")


def _one(setup_name: str, field_name: str, values: list[str], sbatch_every: int) -> Counts:
    setup = next(s for s in SETUPS if s.name == setup_name)
    fld = next(f for f in FIELDS if f.name == field_name)
    with tempfile.TemporaryDirectory(prefix="hostile-audit-") as tmp:
        return run_matrix(values, Path(tmp), setups=[setup], fields=[fld], sbatch_every=sbatch_every)


def _add(total: Counts, part: Counts) -> None:
    for f in fields(Counts):
        if f.name == "failures":
            total.failures.extend(part.failures[: max(0, 200 - len(total.failures))])
        else:
            setattr(total, f.name, getattr(total, f.name) + getattr(part, f.name))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    ap.add_argument("--budget", type=float, default=0, help="seconds after which no new pair starts (0: no limit)")
    ap.add_argument("--values", type=int, default=0, help="use only the first N corpus strings (0: all)")
    ap.add_argument("--sbatch-every", type=int, default=1, help="sbatch-parse every Nth rendered Slurm case")
    args = ap.parse_args(argv)
    values = corpus()
    if args.values:
        values = values[: args.values]
    todo = pairs()
    random.Random(20).shuffle(todo)
    total = Counts()
    start = time.monotonic()
    done_pairs = 0
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        queue = list(todo)
        running: set[Future[Counts]] = set()
        while queue or running:
            while queue and len(running) < args.jobs and not (args.budget and time.monotonic() - start > args.budget):
                s, f = queue.pop(0)
                running.add(pool.submit(_one, s.name, f.name, values, args.sbatch_every))
            if not running:
                break
            finished, running = wait(running, return_when=FIRST_COMPLETED)
            for fut in finished:
                _add(total, fut.result())
                done_pairs += 1
                print(f"# {done_pairs}/{len(todo)} pairs, {time.monotonic() - start:.0f}s: {total.line()}",
                      file=sys.stderr, flush=True)
    print(f"hostile audit: {len(values)} strings, {done_pairs} of {len(todo)} (setup, field) pairs, "
          f"{len(SETUPS)} setups, {len(FIELDS)} fields, {time.monotonic() - start:.0f}s")
    print(total.line())
    for line in total.failures[:50]:
        print("  " + line[:400])
    return 1 if any(getattr(total, p) for p in PROBLEMS) else 0


if __name__ == "__main__":
    sys.exit(main())
