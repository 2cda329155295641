"""Recovery after a node loss: the in-allocation supervisor with a spare vs. today's requeue path.

Both paths run on the dev cluster in the same run, interleaved round by round: the deterministic
training of tests/integration/scripts/ckpt_train.py (2 nodes x 1 rank, gloo, a checkpoint every
``--every`` steps) loses its second node to ``torchhpc devcluster fail`` (link cut, every process
of the node killed) after step ``--fault-at``. Measured from the fault:

* ``supervisor`` (``--spares 1 --max-restarts 1``): the node stops answering the supervisor's TCP
  check of its slurmd, the step is killed, the second attempt starts on the spare;
* ``requeue`` (``--requeue``, no supervisor): Slurm marks the node down after SlurmdTimeout, fails
  the job (NODE_FAIL), requeues it, holds it for the credential lifetime, starts it again.

For each: fault -> failure detected, fault -> second attempt launched, fault -> the second
attempt's first optimizer step (the figure docs/resilience.md reports; goal <= 60 s). Also the
cost of the liveness check: one TCP connect to slurmd per node per check, timed here.

Run as root with the dev cluster up (``torchhpc devcluster up --nodes 3``):
``.venv/bin/python benchmarks/recovery.py [--rounds 1]``. Absolute figures on shared 2-core
machines move a lot with the load (every rank imports torch); the same-run ratio means more.
Prints a table; no timed assertions.
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
from typing import Any, Optional

REPO = Path(__file__).resolve().parent.parent
TRAIN = REPO / "tests" / "integration" / "scripts" / "ckpt_train.py"
_STEP = re.compile(r"^step (\d+) restart=(\d+) t=([\d.]+)", re.M)


def sh(argv: list[str], env: dict[str, str], timeout: float = 120, cwd: Optional[Path] = None) -> str:
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:6])} ... exited {done.returncode}: {done.stderr.strip()[-400:]}")
    return done.stdout


def job_field(env: dict[str, str], job: str, key: str) -> str:
    out = sh(["scontrol", "show", "job", "-o", job], env)
    m = re.search(rf"\b{key}=(\S*)", out)
    return m.group(1) if m else ""


def rank0_steps(job_dir: Path) -> list[tuple[int, int, float]]:
    text = "".join(p.read_text(errors="replace") for p in job_dir.glob("ranks/rank-0@*.log"))
    return [(int(a), int(b), float(c)) for a, b, c in _STEP.findall(text)]


def wait(pred: Any, timeout: float, what: str, every: float = 0.2) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(every)
    raise RuntimeError(f"timed out waiting for {what}")


def one(path: str, env: dict[str, str], out: Path, fault_at: int, every: int, state_dir: str) -> dict[str, float]:
    out.mkdir(parents=True, exist_ok=True)
    flags = ["--spares", "1", "--max-restarts", "1"] if path == "supervisor" else ["--requeue"]
    name = f"rec{path[:3]}"
    run = sh([sys.executable, "-m", "torchhpc", "run", "--scheduler", "slurm", "--launcher", "srun", "-N", "2",
              "--nproc-per-node", "1", "--name", name, "--output-dir", str(out), *flags, str(TRAIN),
              "--steps", str(fault_at + 4 * every), "--ckpt-every", str(every), "--sleep", "0.1",
              "--ckpt", str(out / f"ckpt-{path}"), "--out", str(out / f"final-{path}.pt")], env, cwd=out)
    job = re.search(r"Submitted slurm:(\d+)", run).group(1)  # type: ignore[union-attr]
    job_dir = out / f"{name}-{job}"
    nodes = wait(lambda: job_field(env, job, "NodeList") if job_field(env, job, "JobState") == "RUNNING" else "",
                 300, "the job to start")
    victim = sh(["scontrol", "show", "hostnames", nodes], env).split()[1]
    wait(lambda: any(s >= fault_at for s, _r, _t in rank0_steps(job_dir)), 300, f"step {fault_at}", every=0.05)
    t_fault = time.time()
    cli = [sys.executable, "-m", "torchhpc", "devcluster"]
    sh([*cli, "fail", victim, "--state-dir", state_dir], env)
    try:
        second = wait(lambda: [t for _s, r, t in rank0_steps(job_dir) if r >= 1], 600, "the second attempt's first step")
        wait(lambda: job_field(env, job, "JobState") in ("COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL"), 600, "the end")
    finally:
        sh([*cli, "revive", victim, "--state-dir", state_dir], env)
    fig: dict[str, float] = {"first_step_s": min(second) - t_fault}
    tries = json.loads((job_dir / "attempts.json").read_text()) if (job_dir / "attempts.json").exists() else []
    if len(tries) >= 2:
        fig["detected_s"] = float(tries[0]["ended"]) - t_fault
        fig["launched_s"] = float(tries[1]["started"]) - t_fault
    else:  # the requeue path: when the requeued job's ranks were up (torch imported)
        starts = [float(t) for t in re.findall(r"START step=\d+ .*?restart=1 t=([\d.]+)", "".join(
            p.read_text(errors="replace") for p in job_dir.glob("ranks/rank-0@*.log")))] or [float("nan")]
        fig["launched_s"] = starts[0] - t_fault
    fig["job_state_completed"] = float(job_field(env, job, "JobState") == "COMPLETED")
    return fig


PARTS_RANK = REPO / "benchmarks" / "recovery_rank.py"
_MARK = re.compile(r"^(?:\[\S+\] )?(UP|IMPORTED|RDZV|STEP 0) restart=(\d+) t=([\d.]+)", re.M)


def parts(launcher: str, env: dict[str, str], out: Path, state_dir: str, fault_at: int = 20,
          spare: bool = True) -> dict[str, float]:
    """One 2x2 gloo job under ``launcher`` with one spare loses its second node at step ``fault_at``;
    the restart split into its parts, from attempts.json and the rank's own stage lines (seconds).
    ``spare=False``: the same 3 nodes held as a 3x2 job with ``--min-nodes 2`` and no spare, which goes on
    on the 2 nodes left (docs/resilience.md, "Go on without a spare")."""
    out.mkdir(parents=True, exist_ok=True)
    name = f"parts{launcher[:3]}{'' if spare else 'ns'}"
    shape = ["-N", "2", "--spares", "1"] if spare else ["-N", "3", "--min-nodes", "2"]
    run = sh([sys.executable, "-m", "torchhpc", "run", "--scheduler", "slurm", "--launcher", launcher, *shape,
              "--nproc-per-node", "2", "--name", name, "--output-dir", str(out),
              "--max-restarts", "1", str(PARTS_RANK), str(fault_at + 60)], env, cwd=out)
    job = re.search(r"Submitted slurm:(\d+)", run).group(1)  # type: ignore[union-attr]
    job_dir = out / f"{name}-{job}"

    def marks() -> list[tuple[str, int, float]]:
        text = "".join(p.read_text(errors="replace") for p in job_dir.glob("ranks/rank-0@*.log"))
        return [(k, int(r), float(t)) for k, r, t in _MARK.findall(text)]

    def steps() -> int:
        text = "".join(p.read_text(errors="replace") for p in job_dir.glob("ranks/rank-0@*.log"))
        return max([int(n) for n in re.findall(r"STEP (\d+) restart=0", text)] or [-1])

    nodes = wait(lambda: job_field(env, job, "NodeList") if job_field(env, job, "JobState") == "RUNNING" else "",
                 300, "the job to start")
    wait(lambda: steps() >= fault_at, 300, f"step {fault_at}", every=0.05)
    victim = sh(["scontrol", "show", "hostnames", nodes], env).split()[1]
    t_fault = time.time()
    cli = [sys.executable, "-m", "torchhpc", "devcluster"]
    sh([*cli, "fail", victim, "--state-dir", state_dir], env)
    try:
        wait(lambda: any(k == "STEP 0" and r >= 1 for k, r, _t in marks()), 300, "the second attempt's first step")
        wait(lambda: job_field(env, job, "JobState") in ("COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL"), 300, "the end")
    finally:
        sh([*cli, "revive", victim, "--state-dir", state_dir], env)
    a0, a1 = json.loads((job_dir / "attempts.json").read_text())[:2]
    m = {k: t for k, r, t in marks() if r >= 1}
    fig = {
        "detect": a0["fault"] - t_fault,
        "teardown": a0["teardown_s"] or 0.0,
        "health": a1["health_s"] or 0.0,
    }
    fig["other"] = a1["launched"] - t_fault - fig["detect"] - fig["teardown"] - fig["health"]
    fig["step_start"] = m["UP"] - a1["launched"]
    fig["import"] = m["IMPORTED"] - m["UP"]
    fig["rendezvous"] = m["RDZV"] - m["IMPORTED"]
    fig["first_line"] = (a1["first_line"] or float("nan")) - t_fault
    fig["first_step"] = m["STEP 0"] - t_fault
    fig["completed"] = float(job_field(env, job, "JobState") == "COMPLETED")
    return fig


def main_parts(a: argparse.Namespace, state: Any) -> int:
    env = state.client_env()
    out = Path(tempfile.mkdtemp(prefix="thpc-recovery-parts-"))
    keys = ("detect", "teardown", "health", "other", "step_start", "import", "rendezvous", "first_line", "first_step")
    rows = [(ln, True) for ln in a.launchers.split(",")]
    if a.no_spare:  # beside each launcher's spare restart, the same job shrinking without one, interleaved
        rows = [(ln, spare) for ln, _ in rows for spare in (True, False)]
    results: dict[str, list[dict[str, float]]] = {f"{ln}{'' if s else ' no-spare'}": [] for ln, s in rows}
    for r in range(a.rounds):
        for launcher, spare in rows:
            row = f"{launcher}{'' if spare else ' no-spare'}"
            results[row].append(parts(launcher, env, out / f"r{r}-{launcher}-{int(spare)}", state.state_dir,
                                      spare=spare))
            print(f"# round {r} {row}: load {os.getloadavg()[0]:.2f} "
                  + " ".join(f"{k}={v:.2f}" for k, v in results[row][-1].items()), flush=True)
    print("# restart after a node loss, 2x2 gloo, one spare (no-spare: 3x2 with --min-nodes 2, on to 2x2): "
          "fault -> ..., seconds, median over rounds")
    print(f"{'launcher':<18}" + "".join(f"{k:>11}" for k in keys))
    for row, figs in results.items():
        print(f"{row:<18}" + "".join(f"{statistics.median(f[k] for f in figs):>11.2f}" for k in keys))
    for launcher, _ in rows[::2] if a.no_spare else []:
        with_, without = results[launcher], results[f"{launcher} no-spare"]
        ratio = statistics.median(f["first_step"] for f in without) / statistics.median(f["first_step"] for f in with_)
        print(f"# {launcher}: first step without a spare / with one = {ratio:.2f}x")
    print(f"# load average now: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    return 0


def probe_cost(netns: str, nodes: list[str], n: int = 200) -> float:
    """Mean seconds of one liveness check (a TCP connect to slurmd), timed in the batch host's namespace."""
    code = ("import time; from torchhpc.schedulers import get_scheduler\n"
            "a = get_scheduler('slurm').allocation_of('0', {}); a._port = 6818  # SlurmdPort, not asked here\n"
            f"t = time.perf_counter()\nfor _ in range({n}):\n  [a.alive(h) for h in {nodes!r}]\n"
            f"print((time.perf_counter()-t)/{n * len(nodes)})")
    return float(sh(["ip", "netns", "exec", netns, sys.executable, "-c", code], dict(os.environ)).strip())


def main() -> int:
    from torchhpc.devcluster import load_state

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--fault-at", type=int, default=30)
    p.add_argument("--every", type=int, default=10)
    p.add_argument("--json", default=None, help="also write the figures here")
    p.add_argument("--parts", action="store_true",
                   help="the supervisor's restart only, 2x2, split into detect, teardown, health gate, step start, "
                        "import, rendezvous, first line and first step, for each of --launchers")
    p.add_argument("--launchers", default="srun,torchrun,mpirun")
    p.add_argument("--no-spare", action="store_true",
                   help="with --parts: beside each launcher's spare restart, the same loss with no spare and "
                        "--min-nodes (the job goes on on 2 of 3 nodes), and the ratio of their first steps")
    p.add_argument("--quick", action="store_true",
                   help="the table in minutes: one round of both paths (the default), the fault after step 20")
    a = p.parse_args()
    if a.quick:
        a.rounds, a.fault_at = 1, min(a.fault_at, 20)
    state = load_state()
    if state is None:
        print("no dev cluster up: torchhpc devcluster up --nodes 3", file=sys.stderr)
        return 2
    if a.parts:
        return main_parts(a, state)
    env = state.client_env()
    out = Path(tempfile.mkdtemp(prefix="thpc-recovery-"))
    results: dict[str, list[dict[str, float]]] = {"supervisor": [], "requeue": []}
    for r in range(a.rounds):
        order = ["supervisor", "requeue"] if r % 2 == 0 else ["requeue", "supervisor"]
        for path in order:
            results[path].append(one(path, env, out / f"r{r}", a.fault_at, a.every, state.state_dir))
            print(f"# round {r} {path}: " + " ".join(f"{k}={v:.1f}" for k, v in results[path][-1].items()), flush=True)
    cost = probe_cost(state.netns(state.nodes[0]), [state.node_ip(n) for n in state.nodes[:3]])
    print("# recovery after a node loss (fault -> ...), seconds, median over rounds; dev cluster, loaded 2-core machine")
    print(f"{'path':<12}{'detected':>10}{'launched':>10}{'first step':>12}{'completed':>11}")
    def med(figs: list[dict[str, float]], k: str) -> float:
        vals = [f[k] for f in figs if k in f]
        return statistics.median(vals) if vals else float("nan")

    for path, figs in results.items():
        print(f"{path:<12}{med(figs, 'detected_s'):>10.1f}{med(figs, 'launched_s'):>10.1f}{med(figs, 'first_step_s'):>12.1f}"
              f"{med(figs, 'job_state_completed'):>11.0%}")
    sup = statistics.median(f["first_step_s"] for f in results["supervisor"])
    req = statistics.median(f["first_step_s"] for f in results["requeue"])
    print(f"# requeue / supervisor = {req / sup:.2f}x; liveness check: {cost * 1e3:.2f} ms per node per check "
          "(one TCP connect to slurmd, every 2 s)")
    if a.json:
        Path(a.json).write_text(json.dumps({"results": results, "probe_s": cost}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
