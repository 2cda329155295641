"""Start cost against node count: submit -> every rank passed init_process_group.

For N nodes (one rank per node) it submits, on the real Slurm dev cluster:

  torchrun / srun / mpirun   ``torchhpc run -s slurm -N N --nproc-per-node 1 --launcher L probe.py``;
                             each rank prints the wall-clock time right after
                             ``init_process_group("gloo")`` returned (env:// as
                             the launcher's contract gives it)
  floor                      ``sbatch --wrap "srun python -c 'import torch'"``: the same N
                             nodes importing torch and nothing else, the least any
                             launcher can cost (each task prints the time after the import)

A variant's time is the latest rank's timestamp minus the submit time (one
machine, one clock). The claim under test: torchhpc's start cost grows no
faster than the floor, i.e. the ratio launcher/floor does not grow with N.

On this 2-core machine every node is a namespace on the same two cores, so the
floor itself grows about linearly with N (N imports of torch share two cores);
on a real cluster it would be nearly flat. The ratio is what carries over.

Variants run interleaved (order rotated per round). Needs a dev cluster with
at least max(--nodes) nodes::

    torchhpc devcluster up --nodes 32
    nice python benchmarks/start_scaling.py --nodes 1,2,4,8,16,32 --rounds 1 \\
        --json benchmarks/results/start_scaling.json --markdown docs/scale.md --png docs/img/start_scaling.png

``--from-json`` re-renders the table and plot from a previous run.
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
from typing import Any

REPO = Path(__file__).resolve().parent.parent
LAUNCHERS = ("torchrun", "srun", "mpirun")
VARIANTS = (*LAUNCHERS, "floor")
BEGIN, END = "<!-- start_scaling:begin -->", "<!-- start_scaling:end -->"
PROBE = """\
import os, time
import torch.distributed as dist
dist.init_process_group("gloo")
print(f"STARTED rank={dist.get_rank()} t={time.time():.6f} ;", flush=True)
dist.barrier()
dist.destroy_process_group()
"""
FLOOR = "import time, torch; print(f'STARTED rank=0 t={time.time():.6f} ;', flush=True)"
# Records, not lines: mpirun may splice two ranks' lines (tokens parsed wherever they sit).
RECORD = re.compile(r"STARTED rank=(\d+) t=([0-9.]+) ;")


def _cluster_env() -> dict[str, str]:
    from torchhpc.devcluster import load_state

    state = load_state()
    if state is None:
        sys.exit(
            "no dev cluster up: run `torchhpc devcluster up --nodes 32` (TORCHHPC_DEVCLUSTER_DIR picks one)"
        )
    return state.client_env()


def _stamps(text: str) -> list[float]:
    return [float(t) for _, t in RECORD.findall(text)]


def run_launcher(env: dict[str, str], launcher: str, nodes: int, work: Path, timeout: float) -> float:
    probe = work / "probe.py"
    probe.write_text(PROBE)
    out = work / f"{launcher}-{nodes}-{time.monotonic_ns()}"
    argv = [
        sys.executable, "-m", "torchhpc", "run", "-s", "slurm", "-N", str(nodes), "--nproc-per-node", "1",
        "--launcher", launcher, "--output-dir", str(out), "--name", f"start-{launcher}-{nodes}",
        "--", sys.executable, str(probe),
    ]  # fmt: skip
    t0 = time.time()
    r = subprocess.run(argv, env=env, cwd=work, capture_output=True, text=True, timeout=300)
    m = re.search(r"Submitted slurm:(\d+)", r.stdout)
    if r.returncode != 0 or not m:
        raise RuntimeError(f"{launcher} N={nodes}: submit failed ({r.returncode})\n{r.stdout}\n{r.stderr}")
    state = _wait(env, m.group(1), t0 + timeout)
    text = "".join(f.read_text(errors="replace") for f in sorted(out.rglob("*")) if f.is_file())
    stamps = _stamps(text)
    if state != "COMPLETED" or len(stamps) != nodes:
        raise RuntimeError(
            f"{launcher} N={nodes}: job {m.group(1)} {state}, {len(stamps)}/{nodes} ranks\n{text[-3000:]}"
        )
    return max(stamps) - t0


def _wait(env: dict[str, str], job: str, deadline: float) -> str:
    """Poll ``scontrol show job`` to a final state; a failed or slow poll (a loaded controller) is retried.

    ``torchhpc run --wait`` gives up on the first failed poll, which a 32-node job on a loaded
    2-core machine can hit; a benchmark should measure the job, not the poller.
    """
    state = "UNKNOWN"
    while time.time() < deadline:
        try:
            r = subprocess.run(
                ["scontrol", "show", "job", "-o", job], env=env, capture_output=True, text=True, timeout=60
            )
            found = re.search(r"JobState=(\S+)", r.stdout)
            if found:
                state = found.group(1)
                if state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "SUSPENDED"):
                    return state
        except subprocess.TimeoutExpired:
            pass
        time.sleep(1)
    subprocess.run(
        ["scancel", job], env=env, timeout=60, check=False
    )  # it would hold the next variant's nodes
    return f"{state} (timed out; cancelled)"


def run_floor(env: dict[str, str], nodes: int, work: Path, timeout: float) -> float:
    log = work / f"floor-{nodes}-{time.monotonic_ns()}.out"
    srun = f'srun -N {nodes} --ntasks-per-node=1 {sys.executable} -c "{FLOOR}"'
    t0 = time.time()
    r = subprocess.run(
        ["sbatch", "--parsable", "--wait", "-N", str(nodes), "-o", str(log), "--wrap", srun],
        env=env, cwd=work, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    stamps = _stamps(log.read_text() if log.exists() else "")
    if r.returncode != 0 or len(stamps) != nodes:
        raise RuntimeError(
            f"floor N={nodes}: rc {r.returncode}, {len(stamps)}/{nodes} tasks\n{r.stderr[-2000:]}"
        )
    return max(stamps) - t0


def measure(
    nodes: list[int],
    rounds: int,
    timeout: float,
    base: dict[str, Any] | None = None,
    variants: tuple[str, ...] = VARIANTS,
) -> dict[str, Any]:
    """Run the rounds; ``base`` (a previous result) contributes its samples too."""
    env = _cluster_env()
    all_nodes = sorted({*nodes, *(int(n) for n in (base or {}).get("nodes", []))})
    samples: dict[str, dict[int, list[float]]] = {v: {n: [] for n in all_nodes} for v in VARIANTS}
    for v, per_n in (base or {}).get("samples", {}).items():
        for n, got in per_n.items():
            samples[v][int(n)].extend(got)
    with tempfile.TemporaryDirectory(prefix="start-scaling-", dir=os.environ.get("TMPDIR", "/var/tmp")) as d:
        work = Path(d)
        for rnd in range(rounds):
            for n in nodes:
                order = variants[rnd % len(variants) :] + variants[: rnd % len(variants)]
                for v in order:
                    try:
                        s = (
                            run_floor(env, n, work, timeout)
                            if v == "floor"
                            else run_launcher(env, v, n, work, timeout)
                        )
                    except (RuntimeError, subprocess.TimeoutExpired) as e:
                        why = "\n#   ".join(str(e).splitlines()[:40])
                        print(f"# round {rnd + 1} N={n:>2} {v:<8} FAILED: {why}", flush=True)
                        continue
                    samples[v][n].append(s)
                    print(f"# round {rnd + 1} N={n:>2} {v:<8} {s:6.1f} s", flush=True)
    return {
        "nodes": all_nodes,
        "rounds": max(rounds, int((base or {}).get("rounds", 0))),
        "samples": {v: {str(n): s for n, s in d.items()} for v, d in samples.items()},
    }


def medians(result: dict[str, Any]) -> dict[str, dict[int, float | None]]:
    out: dict[str, dict[int, float | None]] = {}
    for v, per_n in result["samples"].items():
        out[v] = {int(n): (statistics.median(s) if s else None) for n, s in per_n.items()}
    return out


def growth(med: dict[str, dict[int, float | None]], variant: str) -> float | None:
    """(T(N_max) - T(N_min)) of a variant over the same for the floor: 1.0 = grows like the floor."""
    ns = sorted(med["floor"])
    lo, hi = ns[0], ns[-1]
    a, b, fa, fb = med[variant][lo], med[variant][hi], med["floor"][lo], med["floor"][hi]
    if None in (a, b, fa, fb) or fb == fa:  # type: ignore[operator]
        return None
    return (b - a) / (fb - fa)  # type: ignore[operator]


def markdown(result: dict[str, Any]) -> str:
    med = medians(result)
    ns = sorted(int(n) for n in result["nodes"])
    head = "| nodes | floor (s) | " + " | ".join(f"{v} (s) | {v}/floor" for v in LAUNCHERS) + " |"
    rule = "|---:|---:|" + "---:|---:|" * len(LAUNCHERS)
    rows = [head, rule]
    for n in ns:
        f = med["floor"][n]
        cells = [str(n), "failed" if f is None else f"{f:.1f}"]
        for v in LAUNCHERS:
            t = med[v][n]
            cells.append("failed" if t is None else f"{t:.1f}")
            cells.append("-" if t is None or not f else f"{t / f:.2f}")
        rows.append("| " + " | ".join(cells) + " |")
    rows.append("")
    growths = []
    for v in LAUNCHERS:
        g = growth(med, v)
        growths.append(f"{v} {'n/a' if g is None else f'{g:.2f}'}")
    rows.append(
        f"Growth from {ns[0]} to {ns[-1]} nodes, as a multiple of the floor's growth "
        f"(1.0 = grows exactly like `import torch` on N nodes): {', '.join(growths)}. "
        f"Medians of {result['rounds']} round(s), one rank per node."
    )
    return "\n".join(rows) + "\n"


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    med = medians(result)
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for v in VARIANTS:
        pts = sorted((n, t) for n, t in med[v].items() if t is not None)
        if pts:
            style = "k--" if v == "floor" else "-o"
            label = "floor: srun python -c 'import torch'" if v == "floor" else f"torchhpc run --launcher {v}"
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("nodes (one rank each; all nodes share this machine's 2 cores)")
    ax.set_ylabel("submit -> every rank past init (s)")
    ax.set_title("Start cost against node count (Slurm dev cluster)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def write_markdown(doc: Path, table: str) -> None:
    text = doc.read_text() if doc.exists() else ""
    block = f"{BEGIN}\n{table}{END}"
    if BEGIN in text and END in text:
        text = text[: text.index(BEGIN)] + block + text[text.index(END) + len(END) :]
    else:
        text = text + ("\n" if text else "") + block + "\n"
    doc.write_text(text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", default="1,2,4,8,16,32", help="comma-separated node counts")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per job")
    ap.add_argument("--json", type=Path, help="write the raw samples here")
    ap.add_argument("--from-json", type=Path, help="render a previous run instead of measuring")
    ap.add_argument("--merge", type=Path, help="add this run's samples to a previous run's JSON")
    ap.add_argument(
        "--variants", default=",".join(VARIANTS), help="comma-separated subset of " + ",".join(VARIANTS)
    )
    ap.add_argument("--markdown", type=Path, help=f"put the table between {BEGIN} and {END} in this file")
    ap.add_argument("--png", type=Path, help="write the plot here")
    a = ap.parse_args()
    if a.from_json:
        result = json.loads(a.from_json.read_text())
    else:
        base = json.loads(a.merge.read_text()) if a.merge else None
        variants = tuple(v for v in a.variants.split(",") if v)
        if not set(variants) <= set(VARIANTS):
            ap.error(f"--variants takes {','.join(VARIANTS)}")
        result = measure([int(n) for n in a.nodes.split(",")], a.rounds, a.timeout, base, variants)
        if a.json:
            a.json.parent.mkdir(parents=True, exist_ok=True)
            a.json.write_text(json.dumps(result, indent=1) + "\n")
    table = markdown(result)
    print(table)
    if a.markdown:
        write_markdown(a.markdown, table)
    if a.png:
        plot(result, a.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
