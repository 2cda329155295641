"""The hang watch and ``top --once`` at scale, on the running dev cluster.

Submits tests/integration/scripts/planted_hang.py (gloo; the last rank sleeps before the
all_reduce every other rank waits in) as ``--nodes N --nproc-per-node P --launcher srun`` with
``run --hang-timeout T --wait``, and measures:

* **named after the timeout**: from the moment the last rank output line is T seconds old to the
  first ``torchhpc: hang:`` line (the probe of every node, the stacks read, the verdict);
* **top --once**: while the job hangs, once every rank is up, how long ``torchhpc top JOB --once
  --json`` takes, whether it lists every rank, and whom it flags (the hung rank: it is the one
  rank not in a collective while the others wait in one);
* where the time goes: job start to every rank up, and the probe's own duration.

Run (with a dev cluster of at least N nodes up):
``.venv/bin/python benchmarks/hang_at_scale.py --nodes 32 --nproc-per-node 4 --hang-timeout 30``.
Memory: every rank imports torch (~150 MB of its own memory here): check ``free`` first.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HANG = REPO / "tests" / "integration" / "scripts" / "planted_hang.py"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=32)
    ap.add_argument("--nproc-per-node", type=int, default=4)
    ap.add_argument("--hang-timeout", type=float, default=30.0)
    ap.add_argument("--skip-top", action="store_true", help="measure the hang watch alone (top's probes take memory too)")
    args = ap.parse_args()
    world = args.nodes * args.nproc_per_node
    out = Path(tempfile.mkdtemp(prefix="hang-scale-"))
    cmd = [sys.executable, "-m", "torchhpc", "run", "--scheduler", "slurm", "--nodes", str(args.nodes),
           "--nproc-per-node", str(args.nproc_per_node), "--launcher", "srun", "--output-dir", str(out),
           "--name", "hang-scale", "--hang-timeout", f"{args.hang_timeout:g}", str(HANG), str(world - 1), "--wait"]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: dict[str, float] = {}
    err_lines: list[str] = []

    def read_err() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            err_lines.append(line)
            if "torchhpc: hang:" in line and "named" not in seen:
                seen["named"] = time.time()
                writes = [p.stat().st_mtime for p in out.glob("*/ranks/rank-*.log")]
                seen["last_write"] = max(writes) if writes else 0.0
                seen["hang_line"] = line  # type: ignore[assignment]

    reader = threading.Thread(target=read_err, daemon=True)
    reader.start()
    assert proc.stdout is not None
    job = ""
    for line in proc.stdout:
        m = re.search(r"Submitted slurm:(\d+)", line)
        if m:
            job = m.group(1)
            break
    threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep draining: the log comes at the end
    print(f"# {world} ranks on {args.nodes} nodes, job slurm:{job}, hang timeout {args.hang_timeout:g} s", flush=True)
    up_at = None
    top: dict[str, object] = {}
    while proc.poll() is None:
        ups = sum(1 for p in out.glob("*/ranks/rank-*.log") if "up" in p.read_text(errors="replace"))
        if up_at is None and ups >= world:
            up_at = time.monotonic()
            print(f"every rank up {up_at - t0:.0f} s after submit", flush=True)
            if args.skip_top:
                continue
            s = time.monotonic()
            r = subprocess.run([sys.executable, "-m", "torchhpc", "top", f"slurm:{job}", "--once", "--json"],
                               capture_output=True, text=True, timeout=300)
            took = time.monotonic() - s
            try:
                rows = json.loads(r.stdout)
            except ValueError:
                rows = []
            top = {"took_s": round(took, 1), "ranks": len(rows), "hosts": len({x["host"] for x in rows}),
                   "with_samples": sum(1 for x in rows if x["samples"]), "rc": r.returncode,
                   "stragglers": [x["rank"] for x in rows if x["straggler"]], "err": r.stderr.strip()[-300:]}
            print(f"top --once --json: {json.dumps(top)}", flush=True)
        time.sleep(1.0)
    reader.join(timeout=10)
    if "named" in seen:
        after = seen["named"] - seen["last_write"] - args.hang_timeout
        print(f"hang named {after:.1f} s after the timeout (last output line + {args.hang_timeout:g} s)")
    else:
        print("the hang was not named; the command's last lines:")
        print("".join(err_lines[-30:]))
    print("".join(ln for ln in err_lines if "torchhpc: hang:" in ln or "Error" in ln)[-2000:])
    print(f"total {time.monotonic() - t0:.0f} s; job directory {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
