"""The planted Flight Recorder matrix: is every planted collective fault named right, at 2 and 4 ranks?

Each cell runs tests/integration/scripts/planted_collective.py (gloo, rank 1 the culprit) under the local
scheduler, ``torchhpc run -n W --hang-timeout T``, and compares the verdict's first line (the last
``diagnosis:`` line the run prints) with what the planted fault is: the rank that never entered
collective #N, the call that differs, the rank that left the group, or, for a job that completed,
no finding at all (``diagnose`` says "no failure" and ``events`` has no ``flight`` line).

The op is what the recorder writes: gloo has no reduce_scatter of its own, torch records its
``reduce_scatter_tensor`` as one ``all_reduce`` of the whole input, so that column expects all_reduce.

At 2 ranks a size mismatch never hangs: gloo itself sees the peer's message is too long and aborts the
receiving rank (``terminate called ... Received data size doesn't match expected size``) before any
rank can dump, and the other rank is stopped with it. That cell expects the class gloo's words give
(collective-mismatch) and no named rank: without dumps and with no majority of two, none can be named.

Run: ``.venv/bin/python benchmarks/flight_matrix.py --runs 1`` (one run per cell, 26 cells, about 10
minutes on 2 shared cores); ``--ranks 4 --cases skip:all_gather`` for one cell; ``--json`` for the records.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PLANTED = REPO / "tests" / "integration" / "scripts" / "planted_collective.py"
BAD = 1


def _others(world: int) -> str:
    from torchhpc.jobdir.logs import format_ranks

    rest = tuple(r for r in range(world) if r != BAD)
    return f"rank{'s' if len(rest) > 1 else ''} {format_ranks(rest)}"


def expected(mode: str, op: str, world: int) -> str:
    """The verdict's first line (a regular expression) for one cell; "" for a job with no fault."""
    rec = "all_reduce" if op == "reduce_scatter" else op  # what gloo's recorder writes
    them = re.escape(_others(world))
    if mode == "size" and world == 2:
        return r"^collective-mismatch — the ranks called different collectives, or passed tensors of different sizes$"
    return {
        "skip": rf"^hang — rank 1 never entered {rec} #5 \(pg 0\); {them} ha(s|ve) waited in it",
        "sleep": rf"^hang — rank 1 never entered {rec} #4 \(pg 0\); {them} ha(s|ve) waited in it",
        "gather": rf"^collective-mismatch — collective mismatch at #4 \(pg 0\): {them} called {rec}, rank 1 all_gather",
        "size": rf"^collective-mismatch — size mismatch in {rec} #4 \(pg 0\): {them} passed \[\[\d+\]\], rank 1 passed \[\[\d+\]\]",
        "exit": rf"^lost-peer — rank 1 left the group \(exited without destroy_process_group\) before {rec} #4",
        "finish": "",
    }[mode]


CASES = ("skip:all_reduce", "sleep:all_reduce", "gather:all_reduce", "size:all_reduce", "exit:all_reduce",
         "skip:all_gather", "sleep:all_gather", "exit:all_gather", "finish:all_gather",
         "skip:reduce_scatter", "sleep:reduce_scatter", "exit:reduce_scatter", "finish:reduce_scatter")


def tm(env: dict[str, str], cwd: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "torchhpc", *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


def one(world: int, mode: str, op: str, hang_timeout: float, env: dict[str, str], cwd: str) -> dict[str, object]:
    t0 = time.monotonic()
    r = tm(env, cwd, "run", "-n", str(world), "--hang-timeout", f"{hang_timeout:g}", str(PLANTED), mode, str(BAD), op)
    took = time.monotonic() - t0
    said = [ln[len("diagnosis: "):] for ln in r.stderr.splitlines() if ln.startswith("diagnosis: ")]
    want = expected(mode, op, world)
    if want:
        line = said[-1] if said else ""
        ok = r.returncode != 0 and bool(re.search(want, line))
    else:  # no fault: the run succeeds and nothing, later, claims one
        m = re.search(r"local:([0-9a-f]{10})", r.stderr + r.stdout)
        handle = f"local:{m.group(1)}" if m else ""
        if not handle:  # a foreground success names no handle: the newest local job is this one
            jobs = sorted(Path(env["TORCHHPC_STATE_DIR"]).glob("jobs/local/*"), key=lambda p: p.stat().st_mtime)
            handle = f"local:{jobs[-1].name}" if jobs else ""
        ev = tm(env, cwd, "events", handle, "--json") if handle else None
        kinds = [e["kind"] for e in json.loads(ev.stdout)["events"]] if ev and ev.returncode == 0 else ["?"]
        d = tm(env, cwd, "diagnose", handle) if handle else None
        line = (d.stdout.strip().splitlines() or [""])[0] if d else ""
        ok = r.returncode == 0 and "flight" not in kinds and "?" not in kinds and "no failure" in line
    return {"world": world, "case": f"{mode}:{op}", "ok": ok, "seconds": round(took, 1), "line": line,
            "rc": r.returncode, "expected": want}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="runs per cell (1: the matrix once)")
    ap.add_argument("--ranks", default="2,4", help="world sizes, comma-separated")
    ap.add_argument("--cases", default=",".join(CASES), help="MODE:OP cells, comma-separated")
    ap.add_argument("--hang-timeout", type=float, default=8.0)
    ap.add_argument("--json", action="store_true", help="one JSON record per run instead of the table")
    ap.add_argument("--quick", action="store_true", help="the table in minutes: every cell once (--runs 1)")
    a = ap.parse_args()
    if a.quick:
        a.runs = 1
    env = dict(os.environ)
    state = tempfile.mkdtemp(prefix="flight-matrix-")
    env["TORCHHPC_STATE_DIR"] = state  # the matrix's jobs stay out of the user's list
    cells = [(int(w), *c.split(":", 1)) for w in a.ranks.split(",") for c in a.cases.split(",")]
    t0, bad, records = time.monotonic(), 0, []
    if not a.json:
        print(f"# planted Flight Recorder matrix: {len(cells)} cells x {a.runs} run(s), gloo, rank {BAD} the culprit, "
              f"--hang-timeout {a.hang_timeout:g}")
        print(f"# {'ranks':>5}  {'case':<22} {'named':>6}  {'median s':>8}  verdict")
    for world, mode, op in cells:
        runs = [one(world, mode, op, a.hang_timeout, env, state) for _ in range(a.runs)]
        records += runs
        good = sum(1 for x in runs if x["ok"])
        bad += good < len(runs)
        if a.json:
            continue
        wrong = next((x for x in runs if not x["ok"]), runs[0])
        med = statistics.median(float(x["seconds"]) for x in runs)  # type: ignore[arg-type]
        print(f"  {world:>5}  {mode + ':' + op:<22} {good:>2}/{len(runs):<3}  {med:>8.1f}  {wrong['line'] or '(none)'}",
              flush=True)
    if a.json:
        print(json.dumps(records, indent=1))
    else:
        print(f"# {len(cells) - bad}/{len(cells)} cells named right in every run; {time.monotonic() - t0:.0f} s in all")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
