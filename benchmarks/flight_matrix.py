"""The planted Flight Recorder matrix: is every planted collective fault named right, at 2 and 4 ranks,
and in subgroups at 4 and 8?

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

The subgroup cells (issue 65) run tests/integration/scripts/planted_subgroup.py: groups as pairs, halves,
strides ({r, r+W/2}) and the rows and columns of a 2 x W/2 DeviceMesh, where rank W/2+1 skips its
subgroup's all_reduce, calls all_gather there, or passes another size. The verdict must name that rank
first, with its group's members, and the world's wait as its consequence ("..., so ranks 0-1,3 wait for
rank 2 in the world's all_reduce #4"). A size mismatch in a two-rank group is not a cell: gloo aborts
both ranks before any dump, as in the world cell at 2 ranks.

Run: ``.venv/bin/python benchmarks/flight_matrix.py --runs 1`` (one run per cell, 26 + 19 cells, about 25
minutes on 2 shared cores); ``--ranks 4 --cases skip:all_gather --sub-cases ''`` for one cell;
``--sub-ranks 4 --sub-cases row:skip`` for one subgroup cell; ``--json`` for the records.
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
SUBGROUP = REPO / "tests" / "integration" / "scripts" / "planted_subgroup.py"
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


def sub_bad(world: int) -> int:
    """The rank that breaks its subgroup's collective: in the second half, not its first rank (3 of 4, 5 of 8)."""
    return world // 2 + 1


def sub_group(layout: str, world: int) -> tuple[int, ...]:
    """The culprit's group in ``layout`` (planted_subgroup.py's groups)."""
    bad, half = sub_bad(world), world // 2
    if layout == "pairs":
        return (bad - bad % 2, bad - bad % 2 + 1)
    if layout in ("halves", "row"):
        return tuple(range(half, world)) if bad >= half else tuple(range(half))
    return (bad % half, bad % half + half)  # strides, col: {r, r + W/2}


def sub_expected(layout: str, mode: str, world: int) -> str:
    """The verdict's first line (a regular expression) for one subgroup cell; "" for a job with no fault."""
    from torchhpc.jobdir.logs import format_ranks

    def ranks(rs: tuple[int, ...]) -> str:
        return re.escape(f"rank{'s' if len(rs) > 1 else ''} {format_ranks(rs)}")

    bad, group = sub_bad(world), sub_group(layout, world)
    partners = tuple(r for r in group if r != bad)
    members = re.escape(",".join(map(str, group)))
    if mode == "skip":
        waiting = tuple(r for r in range(world) if r not in partners)
        return (rf"^hang — rank {bad} never entered all_reduce #4 of the group of ranks {members} \(pg \d+(, mesh_\w+)?\); "
                rf"{ranks(partners)} ha(s|ve) waited in it( for \d+ s)?, so {ranks(waiting)} wait for "
                rf"{ranks(partners)} in the world's all_reduce #4 \(pg 0\)")
    if mode == "gather":
        rest = tuple(r for r in range(world) if r not in group)
        return (rf"^collective-mismatch — collective mismatch at #4 of the group of ranks {members} \(pg \d+(, mesh_\w+)?\): "
                rf"{ranks(partners)} called all_reduce, rank {bad} all_gather, so {ranks(rest)} wait for "
                rf"{ranks(group)} in the world's all_reduce #4 \(pg 0\)")
    if mode == "size":
        others = tuple(r for r in range(world) if r != bad)
        return (rf"^collective-mismatch — size mismatch in all_reduce #4 of the group of ranks {members} \(pg \d+(, mesh_\w+)?\): "
                rf"{ranks(partners)} passed \[\[4\]\], rank {bad} passed \[\[8\]\], so {ranks(others)} wait for "
                rf"rank {bad} in the world's all_reduce #4 \(pg 0\)")
    return ""


SUB_CASES = ("pairs:skip", "halves:skip", "strides:skip", "row:skip", "col:skip", "pairs:gather", "halves:gather",
             "halves:size", "pairs:finish", "row:finish")


CASES = ("skip:all_reduce", "sleep:all_reduce", "gather:all_reduce", "size:all_reduce", "exit:all_reduce",
         "skip:all_gather", "sleep:all_gather", "exit:all_gather", "finish:all_gather",
         "skip:reduce_scatter", "sleep:reduce_scatter", "exit:reduce_scatter", "finish:reduce_scatter")


def tm(env: dict[str, str], cwd: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "torchhpc", *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


def label(mode: str, op: str) -> str:
    """A cell's name: MODE:OP, or sub:LAYOUT:MODE for a subgroup cell."""
    return f"{op}:{mode}" if op.startswith("sub:") else f"{mode}:{op}"


def one(world: int, mode: str, op: str, hang_timeout: float, env: dict[str, str], cwd: str,
        slurm: bool = False) -> dict[str, object]:
    """One cell's run: ``op`` is a world cell's collective, or a subgroup cell's layout (``sub:LAYOUT``).
    ``slurm``: on the dev cluster, 2 nodes under srun, ``run --wait`` watching for the hang."""
    t0 = time.monotonic()
    if op.startswith("sub:"):
        layout = op[4:]
        argv = [str(SUBGROUP), layout, mode, str(sub_bad(world))]
        want = sub_expected(layout, mode, world)
    else:
        argv = [str(PLANTED), mode, str(BAD), op]
        want = expected(mode, op, world)
    shape = ["-n", str(world)] if not slurm else [
        "--scheduler", "slurm", "--launcher", "srun", "-N", "2", "--nproc-per-node", str(world // 2), "--wait"]
    r = tm(env, cwd, "run", *shape, "--hang-timeout", f"{hang_timeout:g}", *argv, timeout=600)
    took = time.monotonic() - t0
    said = [ln[len("diagnosis: "):] for ln in r.stderr.splitlines() if ln.startswith("diagnosis: ")]
    if want:
        line = said[-1] if said else ""
        ok = r.returncode != 0 and bool(re.search(want, line))
    else:  # no fault: the run succeeds and nothing, later, claims one
        m = re.search(r"(local:[0-9a-f]{10}|slurm:\d+)", r.stderr + r.stdout)
        handle = m.group(1) if m else ""
        if not handle:  # a foreground success names no handle: the newest local job is this one
            jobs = sorted(Path(env["TORCHHPC_STATE_DIR"]).glob("jobs/local/*"), key=lambda p: p.stat().st_mtime)
            handle = f"local:{jobs[-1].name}" if jobs else ""
        ev = tm(env, cwd, "events", handle, "--json") if handle else None
        kinds = [e["kind"] for e in json.loads(ev.stdout)["events"]] if ev and ev.returncode == 0 else ["?"]
        d = tm(env, cwd, "diagnose", handle) if handle else None
        line = (d.stdout.strip().splitlines() or [""])[0] if d else ""
        ok = r.returncode == 0 and "flight" not in kinds and "?" not in kinds and "no failure" in line
    return {"world": world, "case": label(mode, op), "ok": ok, "seconds": round(took, 1), "line": line,
            "rc": r.returncode, "expected": want}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="runs per cell (1: the matrix once)")
    ap.add_argument("--ranks", default="2,4", help="world sizes, comma-separated")
    ap.add_argument("--cases", default=",".join(CASES), help="MODE:OP cells, comma-separated")
    ap.add_argument("--sub-ranks", default="4,8", help="world sizes of the subgroup cells (even, at least 4)")
    ap.add_argument("--sub-cases", default=",".join(SUB_CASES), help="LAYOUT:MODE subgroup cells, comma-separated")
    ap.add_argument("--hang-timeout", type=float, default=8.0)
    ap.add_argument("--json", action="store_true", help="one JSON record per run instead of the table")
    ap.add_argument("--quick", action="store_true", help="the table in minutes: every cell once (--runs 1)")
    ap.add_argument("--slurm", action="store_true",
                    help="on the running dev cluster: each cell on 2 nodes under srun (torchhpc devcluster up)")
    a = ap.parse_args()
    if a.quick:
        a.runs = 1
    env = dict(os.environ)
    state = tempfile.mkdtemp(prefix="flight-matrix-")
    env["TORCHHPC_STATE_DIR"] = state  # the matrix's jobs stay out of the user's list
    cells = [(int(w), *c.split(":", 1)) for w in a.ranks.split(",") if w for c in a.cases.split(",") if c]
    cells += [(int(w), c.split(":")[1], f"sub:{c.split(':')[0]}") for w in a.sub_ranks.split(",") if w
              for c in a.sub_cases.split(",") if c
              and not (c.endswith(":size") and len(sub_group(c.split(":")[0], int(w))) < 4)]  # gloo aborts a pair
    t0, bad, records = time.monotonic(), 0, []
    if not a.json:
        where = "the dev cluster, 2 nodes under srun" if a.slurm else "this machine"
        print(f"# planted Flight Recorder matrix: {len(cells)} cells x {a.runs} run(s), gloo on {where}, rank {BAD} "
              f"the culprit, --hang-timeout {a.hang_timeout:g}")
        print(f"# {'ranks':>5}  {'case':<22} {'named':>6}  {'median s':>8}  verdict")
    for world, mode, op in cells:
        runs = [one(world, mode, op, a.hang_timeout, env, state, a.slurm) for _ in range(a.runs)]
        records += runs
        good = sum(1 for x in runs if x["ok"])
        bad += good < len(runs)
        if a.json:
            continue
        wrong = next((x for x in runs if not x["ok"]), runs[0])
        med = statistics.median(float(x["seconds"]) for x in runs)  # type: ignore[arg-type]
        print(f"  {world:>5}  {label(mode, op):<22} {good:>2}/{len(runs):<3}  {med:>8.1f}  {wrong['line'] or '(none)'}",
              flush=True)
    if a.json:
        print(json.dumps(records, indent=1))
    else:
        print(f"# {len(cells) - bad}/{len(cells)} cells named right in every run; {time.monotonic() - t0:.0f} s in all")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
