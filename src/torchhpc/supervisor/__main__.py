"""``python -m torchhpc.supervisor``: run by the batch script, on the batch host (docs/resilience.md)."""

from __future__ import annotations

import argparse
import sys

from torchhpc.supervisor.loop import Options, main


def parse(argv: list[str]) -> Options:
    p = argparse.ArgumentParser(
        prog="python -m torchhpc.supervisor",
        description="Run the batch script's launch step (the exported bash function _torchhpc_step) on N healthy "
                    "nodes of the allocation; restart it after a node failure, hang or network error, never after "
                    "an exception in the program. Writes <job dir>/attempts.json.",
    )
    p.add_argument("--job-dir", required=True, help="the job's directory (ranks/ and attempts.json)")
    p.add_argument("--nodes", type=int, required=True, help="nodes each attempt uses (the rest are spares)")
    p.add_argument("--nproc-per-node", type=int, default=1, help="ranks per node (mpirun's host list)")
    p.add_argument("--launcher", default="srun", choices=("torchrun", "srun", "mpirun"))
    p.add_argument("--max-restarts", type=int, default=0, help="restarts after a restartable failure")
    p.add_argument("--min-nodes", type=int, default=None,
                   help="with no spare left, go on with the nodes that are left, at least this many (default: --nodes)")
    p.add_argument("--hang-timeout", type=float, default=None, help="quiet seconds before the stacks are read")
    p.add_argument("--requeue", action="store_true", help="when no spare is left, requeue without the failed nodes")
    p.add_argument("--probe-every", type=float, default=2.0, help="seconds between liveness checks of the step's nodes")
    p.add_argument("--scheduler", default="slurm", help="the scheduler whose allocation this runs in")
    p.add_argument("--max-no-progress", type=int, default=3,
                   help="attempts in a row without a checkpoint advance before the job ends with no-progress (0: never)")
    p.add_argument("--checkpoint-dir", default=None, help="where the program's checkpoints are (the newest file's step)")
    p.add_argument("--on-restart-append", default="", metavar="ARGS",
                   help="arguments added to the program on attempts after the first ({latest:GLOB}: the newest match)")
    p.add_argument("--no-health-gate", dest="health", action="store_false",
                   help="skip the checks of the next attempt's nodes (job dir writable, port free, nvidia-smi)")
    p.add_argument("--warm", action="store_true",
                   help="restart with a standby interpreter per node, torch imported (the ranks run this Python)")
    return Options(**vars(p.parse_args(argv)))  # each flag's dest is a field of Options


if __name__ == "__main__":
    raise SystemExit(main(parse(sys.argv[1:])))
