"""Soak the compatibility matrix's framework cells: does code we did not write finish, every time?

Each cell (a framework script of tests/integration/compat/, or benchmarks/soak/) runs N times under
each launcher, beside K busy loops (the load that widens torch's gloo exit race, issue 29), and a
run counts as a failure unless every rank printed its ``COMPAT`` line with the right world and sum
AND the job exited 0 (a rank that aborts at exit after its work is the race). Runs are interleaved
(run 1 of every cell and launcher, then run 2, ...) so that every column sees the same load.

Launchers: ``local`` (``torchhpc run -n 2``), ``torchrun``/``srun``/``mpirun`` (``torchhpc run
--scheduler slurm -N 2 --nproc-per-node 2`` on the dev cluster), and the comparisons outside the
cure: ``plain-torchrun`` (``torchrun --standalone --nproc-per-node 2`` on this machine, no torchhpc
at all) and ``local-nocure`` (torchhpc with ``TORCHHPC_EXIT_CURE=0``). ``--runtime charliecloud
--image DIR`` runs the Slurm launchers inside the container.

    python benchmarks/soak_compat.py -n 20 --hogs 3 --cells hf_trainer \
        --launchers local,torchrun,srun,mpirun,plain-torchrun

``-P K`` runs K of them at once, in that order (scripts/test.sh: ``-P 4``, a run of every launcher at
once): the busy loops stay, and the runs beside each other load the machine more, not less.

``--quick`` prints the table in minutes (one run of every cell under local, srun and mpirun; docs/testing.md
has its time here). Prints one line per run and a Markdown table, failures/runs per cell and launcher (docs/compat.md
keeps the measured one); exit 1 if any run of a torchhpc launcher failed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
COMPAT = REPO / "tests" / "integration" / "compat"
RECORD = re.compile(r"COMPAT row=(\w+) rank=(\d+) world=(\d+) sum=([0-9.]+)")

# cell -> (script, launchers it runs under: the Lightning script is written for 2 nodes x 2 devices,
# submitit's JobEnvironment needs a Slurm job)
CELLS: dict[str, tuple[Path, tuple[str, ...]]] = {
    "hf_trainer": (COMPAT / "hf_trainer.py", ("local", "local-nocure", "plain-torchrun", "torchrun", "srun", "mpirun")),
    # the same script ending with dist.destroy_process_group(): the hang of issue 29 (COMPAT_DESTROY=1)
    "hf_destroy": (COMPAT / "hf_trainer.py", ("local", "local-nocure", "plain-torchrun", "torchrun", "srun", "mpirun")),
    "lightning": (COMPAT / "lightning_trainer.py", ("torchrun", "srun", "mpirun")),
    "ddp_plain": (REPO / "benchmarks" / "soak" / "ddp_plain.py",
                  ("local", "local-nocure", "plain-torchrun", "torchrun", "srun", "mpirun")),
    "submitit": (COMPAT / "submitit_env.py", ("torchrun", "srun", "mpirun")),
}
SLURM = ("torchrun", "srun", "mpirun")
UNCURED = ("plain-torchrun", "local-nocure")
LAUNCHERS = ("local", *SLURM, *UNCURED)
QUEUED = "still queued when the soak gave up: not counted"
# --quick: a launcher of each kind (this machine, Slurm's own, and MPI's) and no comparison column.
QUICK_LAUNCHERS = ("local", "srun", "mpirun")
LIVE: set[subprocess.Popen[str]] = set()  # the runs in flight (-P): killed with their process groups on the way out


@dataclass
class Tally:
    runs: int = 0
    fails: list[str] = field(default_factory=list)


def slurm_env() -> dict[str, str]:
    from torchhpc.devcluster import load_state

    state = load_state()
    if state is None:
        raise SystemExit("Error: no dev cluster is up for the Slurm launchers\n"
                         "HINT: torchhpc devcluster up --nodes 4, or --launchers local,plain-torchrun")
    return {**os.environ, **state.client_env()}


def command(cell: str, launcher: str, out: Path, args: argparse.Namespace) -> tuple[list[str], dict[str, str], int]:
    """argv, environment and world size of one run."""
    script = str(CELLS[cell][0])
    env = {**os.environ, "TMPDIR": str(out)}
    extra: list[str] = []
    if cell == "hf_destroy":
        env["COMPAT_DESTROY"] = "1"
        extra = ["-e", "COMPAT_DESTROY=1"]
    if launcher == "plain-torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", script], env, 2
    run = [sys.executable, "-m", "torchhpc", "run", "--output-dir", str(out), "--name", f"soak-{cell}"]
    if launcher in ("local", "local-nocure"):
        extra += ["-e", "TORCHHPC_EXIT_CURE=0"] if launcher == "local-nocure" else []
        return [*run, "-n", "2", *extra, script], env, 2
    run += ["--scheduler", "slurm", "-N", "2", "--nproc-per-node", "2", "--launcher", launcher,
            "--time", str(max(1, args.timeout // 60)), *extra]
    if args.runtime:
        run += ["--runtime", args.runtime, "--container", args.image]
    return [*run, script, "--wait"], {**slurm_env(), "TMPDIR": str(out)}, 4


def judge(text: str, rc: int | None, world: int) -> str:
    """'' for a good run, else why not."""
    if rc is None:
        return "hang (killed at the timeout)"
    recs = RECORD.findall(text)
    ranks = sorted(int(r[1]) for r in recs)
    if ranks != list(range(world)) or {float(r[3]) for r in recs} != {float(world * (world + 1) // 2)}:
        return f"ranks {ranks} reported (exit {rc})"
    if rc != 0:
        abort = "SIGABRT" if re.search(r"terminate called|SIGABRT|Signal 6|exitcode\s*:\s*-6", text) else "non-zero"
        return f"every rank reported, then exit {rc} ({abort})"
    return ""


def one(cell: str, launcher: str, base: Path, n: int, args: argparse.Namespace) -> str:
    out = base / f"{cell}-{launcher}-{n}"
    out.mkdir(parents=True)
    argv, env, world = command(cell, launcher, out, args)
    p = subprocess.Popen(argv, env=env, cwd=out, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    LIVE.add(p)
    # A Slurm job may wait in the queue first (the dev cluster is shared): its own --time limit catches a
    # hang once it runs (state TIMEOUT, a failure); the soak only gives up on a job that never started.
    limit = args.timeout + (args.queue if launcher in SLURM else 60)
    try:
        text, rc = p.communicate(timeout=limit)[0], p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        text, rc = p.communicate()[0], None
    finally:
        LIVE.discard(p)
    (out / "soak.txt").write_text(text)
    states = re.findall(r"^slurm:\d+ ([A-Z]+)", text, re.M)
    if rc is None and launcher in SLURM and (not states or states[-1] == "PENDING"):
        return QUEUED
    return judge(text, rc, world)


def table(tallies: dict[tuple[str, str], Tally], launchers: list[str]) -> str:
    lines = ["| cell | " + " | ".join(launchers) + " |", "|---|" + "---|" * len(launchers)]
    for cell in CELLS:
        if not any((cell, la) in tallies for la in launchers):
            continue
        cells = []
        for la in launchers:
            t = tallies.get((cell, la))
            cells.append(f"{len(t.fails)}/{t.runs}" if t else "—")
        lines.append(f"| {cell} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", "--runs", type=int, default=int(os.environ.get("SOAK_RUNS", "5")), help="runs per cell and launcher")
    p.add_argument("-P", "--parallel", type=int, default=1, help="runs at once, in order (default 1)")
    p.add_argument("--hogs", type=int, default=int(os.environ.get("SOAK_HOGS", "3")), help="busy loops beside the runs")
    p.add_argument("--cells", default=",".join(CELLS), help=f"comma-separated, of {', '.join(CELLS)}")
    p.add_argument("--launchers", default="local,torchrun,srun,mpirun,plain-torchrun",
                   help=f"comma-separated, of {', '.join(LAUNCHERS)}")
    p.add_argument("--runtime", default="", help="container runtime for the Slurm launchers (charliecloud)")
    p.add_argument("--image", default="", help="the container image (--runtime)")
    p.add_argument("--timeout", type=int, default=300, help="seconds before a run counts as a hang")
    p.add_argument("--queue", type=int, default=1800, help="seconds a Slurm job may wait in the queue")
    p.add_argument("--logs", default="", help="keep every run's output here (default: a new temporary directory)")
    p.add_argument("--quick", action="store_true",
                   help=f"the table in minutes: one run of each cell under {', '.join(QUICK_LAUNCHERS)} (what it "
                        "runs under), beside the busy loops; -n, --cells and --launchers as given win")
    args = p.parse_args(argv)
    if args.quick:
        given = set(argv if argv is not None else sys.argv[1:])
        if not given & {"-n", "--runs"}:
            args.runs = 1
        if "--launchers" not in given:
            args.launchers = ",".join(QUICK_LAUNCHERS)
    cells = [c for c in args.cells.split(",") if c]
    launchers = [la for la in args.launchers.split(",") if la]
    bad = [c for c in cells if c not in CELLS] + [la for la in launchers if la not in LAUNCHERS]
    if bad or args.runs < 1 or args.parallel < 1 or (args.runtime and not args.image):
        print(f"Error: unknown cell/launcher {bad}, -n {args.runs}, -P {args.parallel}, or --runtime without --image\n"
              f"HINT: cells {', '.join(CELLS)}; launchers {', '.join(LAUNCHERS)}", file=sys.stderr)
        return 2
    base = Path(args.logs or tempfile.mkdtemp(prefix="torchhpc-soak-compat."))
    hogs = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(args.hogs)]
    tallies: dict[tuple[str, str], Tally] = {}
    start = time.monotonic()
    print(f"soak: {args.runs} run(s) of {cells} under {launchers}, {args.parallel} at a time, beside {args.hogs} "
          f"busy loop(s); logs in {base}",
          file=sys.stderr, flush=True)
    order = [(n, cell, la) for n in range(1, args.runs + 1) for cell in cells for la in launchers
             if la in CELLS[cell][1]]

    def timed(key: tuple[int, str, str]) -> tuple[str, float]:
        t0 = time.monotonic()
        why = one(key[1], key[2], base, key[0], args)
        return why, time.monotonic() - t0

    try:
        with ThreadPoolExecutor(max_workers=args.parallel) as pool:
            for (n, cell, la), (why, secs) in zip(order, pool.map(timed, order)):
                if why == QUEUED:
                    print(f"soak: {cell} {la} run {n}: {why}", file=sys.stderr, flush=True)
                    continue
                t = tallies.setdefault((cell, la), Tally())
                t.runs += 1
                if why:
                    t.fails.append(f"run {n}: {why}")
                print(f"soak: {cell} {la} run {n}: {why or 'ok'} ({secs:.0f} s)", file=sys.stderr, flush=True)
    finally:
        for run in list(LIVE):  # interrupted: a run in flight would outlive the soak
            with contextlib.suppress(OSError):
                os.killpg(run.pid, signal.SIGKILL)
        for h in hogs:
            h.kill()
            h.wait()
    print(f"\n{sum(t.runs for t in tallies.values())} runs in {time.monotonic() - start:.0f} s beside {args.hogs} "
          f"busy loop(s); failures/runs:\n")
    print(table(tallies, [la for la in LAUNCHERS if la in launchers]))
    for (cell, la), t in tallies.items():
        for why in t.fails:
            print(f"  {cell} {la} {why}")
    cured_fails = sum(len(t.fails) for (_, la), t in tallies.items() if la not in UNCURED)
    return 1 if cured_fails else 0


if __name__ == "__main__":
    sys.exit(main())
