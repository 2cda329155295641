"""``torchhpc doctor``: is this machine (or this job step) ready for distributed PyTorch?"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from torchhpc.cli.common import add_subparser, env_default

_MARK = {"pass": "PASS", "warn": "WARN", "fail": "FAIL", "skip": "skip"}


def register(sub: Any) -> None:
    p = add_subparser(
        sub,
        "doctor",
        "check this node or job step: versions, GPUs, /dev/shm, ulimits, RDMA, interface, port, Slurm, containers",
        description=(
            "One pass/warn/fail table with a HINT per problem. Run it on a login node, or inside a job\n"
            "(`srun torchhpc doctor --in-job`) to see what each task really gets. Exit status 1 when\n"
            "any line fails.\n\n"
            "--gpu measures the GPUs instead: bf16 matmul and memory copy per GPU, an NCCL all_reduce\n"
            "over all visible GPUs and a ResNet-50 training step, each judged against a healthy card\n"
            "of the kind (PASS from 0.85 of it, WARN from 0.60). Without a GPU it says so and exits 0."
        ),
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument("--in-job", dest="in_job", action="store_true", default=None,
                       help="judge as a job step (default: detected from SLURM_STEP_ID, RANK, PBS_JOBID...)")
    where.add_argument("--login", dest="in_job", action="store_false", help="judge as a login node")
    p.add_argument("--master", default=env_default("--master"), help="rendezvous host (default $MASTER_ADDR)")
    p.add_argument("--port", type=int, default=None, help="rendezvous port (default $MASTER_PORT or 29500)")
    p.add_argument("--gpus", type=int, default=None, help="GPUs per node you intend to use (default: from Slurm)")
    p.add_argument("--no-torch", action="store_true", help="do not import torch (saves ~2 s)")
    p.add_argument("--only", action="append", metavar="CHECK", help="run only this check (repeatable)")
    p.add_argument("--gpu", action="store_true",
                   help="measure this node's GPUs (matmul, copy, NCCL all_reduce, a training step) against a healthy node")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> int:
    from torchhpc.doctor import CHECKS, Context, run_checks, to_json
    from torchhpc.errors import UsageError

    names = [n for n, _ in CHECKS]
    for o in args.only or []:
        if o not in names:
            from torchhpc.core.suggest import did_you_mean

            near = did_you_mean(o, names)
            raise UsageError(f"--only {o!r} is not a check", (f"{near} " if near else "") + f"choose from: {', '.join(names)}")
    ctx = Context(in_job=args.in_job, master=args.master, port=args.port, gpus=args.gpus)
    if args.gpu:
        from torchhpc.doctor.gpu import gpu_checks

        results = gpu_checks(emit=(lambda s: print(s, file=sys.stderr)) if args.json else print)
        title = "torchhpc doctor --gpu"
    else:
        results = run_checks(ctx, args.only, skip_torch=args.no_torch)
        title = f"torchhpc doctor ({'inside a job' if ctx.in_job else 'login node / outside a job'})"
    if args.json:
        print(to_json(results, ctx))
    elif results:
        width = max(len(c.name) for c in results)
        print(title)
        for c in results:
            print(f"{_MARK[c.status]}  {c.name.ljust(width)}  {c.detail}")
            if c.hint and c.status in ("warn", "fail"):
                print(f"      {' ' * width}  HINT: {c.hint}")
        counts = {s: sum(c.status == s for c in results) for s in _MARK}
        print(", ".join(f"{v} {k}" for k, v in counts.items() if v))
    return 1 if any(c.status == "fail" for c in results) else 0
