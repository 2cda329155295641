#!/usr/bin/env python3
"""Where the test suite's time goes, by module: docs/testing.md's table, from one run's timings.

    TORCHHPC_TEST_TIMES=times.jsonl ./scripts/test.sh      # or any pytest run: one JSON line per test
    python scripts/test_times.py times.jsonl [--cores 2] [--top 15]

Per module: its tests, their wall minutes (summed over tests), and the share of that time the
machine's CPUs were idle (waiting: on a job to be scheduled, a timeout to expire, a node to be
declared dead). The CPU figure is the whole machine's (/proc/stat), so it counts the dev cluster's
ranks and daemons too; with tests side by side (xdist) a module's share is an estimate.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict


def table(lines: list[dict[str, object]], cores: int, top: int) -> str:
    by_module: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for rec in lines:
        module = str(rec["test"]).split("::", 1)[0]
        by_module[module].append((float(rec["wall_s"]), float(rec["cpu_s"])))  # type: ignore[arg-type]
    total_wall = sum(w for runs in by_module.values() for w, _ in runs)
    rows = sorted(by_module.items(), key=lambda kv: -sum(w for w, _ in kv[1]))
    out = ["| minutes | tests | waiting | module |", "|---:|---:|---:|---|"]
    rest_wall, rest_tests = 0.0, 0
    for i, (module, runs) in enumerate(rows):
        wall = sum(w for w, _ in runs)
        cpu = sum(c for _, c in runs)
        if i >= top:
            rest_wall += wall
            rest_tests += len(runs)
            continue
        waiting = max(0.0, 1.0 - cpu / (wall * cores)) if wall > 0 else 0.0
        out.append(f"| {wall / 60:.1f} | {len(runs)} | {waiting:.0%} | {module} |")
    if rest_tests:
        out.append(f"| {rest_wall / 60:.1f} | {rest_tests} | | the other {len(rows) - top} modules |")
    out.append(f"| **{total_wall / 60:.1f}** | **{len(lines)}** | | all (test time summed over tests) |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("times", help="the JSON lines TORCHHPC_TEST_TIMES wrote")
    p.add_argument("--cores", type=int, default=os.cpu_count() or 1, help="the machine's cores (default: this one's)")
    p.add_argument("--top", type=int, default=15, help="modules shown one by one (default 15)")
    p.add_argument("--write-durations", metavar="FILE",
                   help="also write each test of 1 s or more to FILE (tests/durations.json: the side-by-side "
                        "run's order and hand-out, tests/schedule.py); best from a run one test at a time")
    args = p.parse_args(argv)
    try:
        with open(args.times) as f:
            lines = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError) as e:
        print(f"Error: {args.times}: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(table(lines, args.cores, args.top))
    if args.write_durations:
        with open(args.write_durations, "w") as f:
            f.write(durations_json(lines, args.times))
    return 0


def durations_json(lines: list[dict[str, object]], source: str) -> str:
    """Wall seconds per test (1 s or more; a shorter one counts as its default), node ids without xdist's
    ``@group``; and for the same tests the cores they kept busy on average (the machine's CPU seconds over
    their wall seconds: read one test at a time, it is the test's own load)."""
    tests: dict[str, float] = {}
    cores: dict[str, float] = {}
    for rec in lines:
        nodeid, wall = str(rec["test"]), float(rec["wall_s"])  # type: ignore[arg-type]
        at = nodeid.rfind("@")
        if at > nodeid.rfind("]"):
            nodeid = nodeid[:at]
        if wall >= 1.0:
            tests[nodeid] = round(wall, 1)
            cores[nodeid] = round(float(rec["cpu_s"]) / wall, 2)  # type: ignore[arg-type]
    body = {"about": f"wall seconds per test of 1 s or more, and the cores each kept busy, from "
                     f"{os.path.basename(source)} (scripts/test_times.py --write-durations); read by tests/schedule.py",
            "tests": dict(sorted(tests.items())),
            "cores": dict(sorted(cores.items()))}
    return json.dumps(body, indent=0) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
