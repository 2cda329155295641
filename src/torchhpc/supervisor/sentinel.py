"""The watch on the supervisor's own node: when the batch host dies, the job ends as node-failure (80).

The in-allocation supervisor runs in the batch script, on the batch host (the allocation's first
node). It survives any other node's loss, but not its own: with ``#SBATCH --no-kill`` Slurm keeps a
job whose batch host died RUNNING on the other nodes, with nothing running and no one to end it, and
the allocation is held until someone runs scancel (issue 70). So the supervisor starts this watch once,
as a step of its own on another node of the allocation (the last: a spare, where there is one). It
asks the batch host's slurmd every :data:`EVERY_S` seconds, as the supervisor asks its step's nodes
(schedulers' ``Allocation.alive``); after :data:`MISSES` misses in a row it

1. appends the lost attempt to ``attempts.json`` (class ``node-failure``, the batch host excluded, the
   reason in words), so that ``diagnose`` and ``events`` say what happened;
2. writes the job's end marker, ``end.json``: ``NODE_FAIL``, exit 80 (schedulers/slurm/ending.py reads
   it over Slurm's CANCELLED);
3. says so in the job's ``slurm.out``;
4. cancels the job through the scheduler, which releases the allocation (and ends this watch).

A job that ends normally ends this step with it. Run as ``python -m torchhpc.supervisor.sentinel``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Optional

from torchhpc.core.exitcodes import exit_code_for
from torchhpc.jobdir.attempts import load_attempts, save_attempts
from torchhpc.jobdir.endmark import write_end

__all__ = ["EVERY_S", "MISSES", "batch_host_lost", "main", "sentinel_argv", "watch"]

EVERY_S = 2.0
MISSES = 3  # in a row: a node that lost power or its link misses every one; a busy one answers (the kernel does)
OUTPUT = "slurm.out"  # the job directory's scheduler output (schedulers/slurm/slurm.py's --output)


def sentinel_argv(python: str, job_dir: str, batch_host: str, restart: int) -> list[str]:
    """The watch's command, run once on a node that is not the batch host (the supervisor starts it)."""
    return [python, "-m", "torchhpc.supervisor.sentinel", "--job-dir", job_dir, "--batch-host", batch_host,
            "--restart", str(restart)]


def batch_host_lost(job_dir: str, batch_host: str, restart: int, cancel: Callable[[], None],
                    clock: Callable[[], float] = time.time) -> str:
    """Record the loss (attempts.json, end.json, slurm.out), then ``cancel``; returns the line it said."""
    history = load_attempts(job_dir)
    excluded = sorted({batch_host, *(h for a in history for h in a.get("excluded", ()))})
    now = clock()
    detail = (f"the batch host {batch_host}, where the supervisor ran, stopped answering: the supervisor cannot go on "
              "without its own node, so the job ends (node-failure) and its allocation is released")
    history.append({"attempt": len(history), "nodes": [], "class": "node-failure", "excluded": excluded,
                    "started": now, "ended": now, "exit_code": None, "rank": None, "detail": detail,
                    "found_by": "probe", "batch_host": batch_host})
    save_attempts(job_dir, history)
    write_end(job_dir, "NODE_FAIL", exit_code_for("node-failure"), now, restart)
    line = f"torchhpc: supervisor watch: {detail}"
    with contextlib.suppress(OSError), open(os.path.join(job_dir, OUTPUT), "a", encoding="utf-8") as f:
        f.write(line + "\n")
    cancel()
    return line


def watch(alive: Callable[[], bool], every: float = EVERY_S, misses: int = MISSES,
          sleep: Callable[[float], None] = time.sleep) -> None:
    """Return once ``alive()`` has failed ``misses`` times in a row, asking every ``every`` seconds."""
    missed = 0
    while missed < misses:
        missed = 0 if alive() else missed + 1
        if missed < misses:
            sleep(every if not missed else every / 2)  # a miss is confirmed sooner


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m torchhpc.supervisor.sentinel", description=__doc__.splitlines()[0])
    p.add_argument("--job-dir", required=True)
    p.add_argument("--batch-host", required=True)
    p.add_argument("--restart", type=int, default=0)
    p.add_argument("--scheduler", default="slurm")
    args = p.parse_args(argv)
    from torchhpc.schedulers import get_scheduler

    sched = get_scheduler(args.scheduler)
    alloc = sched.allocation_of("", os.environ)
    watch(lambda: alloc.alive(args.batch_host))
    print(batch_host_lost(args.job_dir, args.batch_host, args.restart, lambda: sched.cancel(alloc.job_id)),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
