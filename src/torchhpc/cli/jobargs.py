"""The job flags shared by ``run``, ``shell`` and ``bench sweep``, and their mapping to a JobSpec.

Precedence for every value: command line > ``TORCHHPC_*`` variable > profile > config file
> built-in default (see :mod:`torchhpc.config`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from torchhpc.core.launcher_kind import LAUNCHERS
from torchhpc.core.spec import RUNTIMES, JobSpec

# Flags that may also follow the program (``torchhpc run ... train.py --wait``).
# Everything else after the program belongs to the program; ``--`` ends our flags.
TRAILING_FLAGS = ("--wait", "--dry-run", "--rank0-only")


def exclude_nodes(value: str) -> str:
    """``--exclude node3,node7`` as given; ``--exclude @FILE``: the names in FILE (commas, spaces or lines)."""
    import re

    from torchhpc.errors import UsageError

    if not value.startswith("@"):
        return value
    path = value[1:]
    try:
        with open(path) as fh:
            lines = [line for line in fh.read().splitlines() if not line.lstrip().startswith("#")]
    except OSError as e:
        raise UsageError(f"--exclude {value}: cannot read {path!r} ({e.strerror})",
                         "give a file of node names, e.g. from `torchhpc bench nodes --exclude-file FILE`") from None
    names = [n for n in re.split(r"[\s,]+", "\n".join(lines)) if n]
    if not names:
        raise UsageError(f"--exclude {value}: {path!r} names no node",
                         "drop --exclude, or write node names in the file (one a line or comma-separated)")
    return ",".join(names)


def _lead_time(value: str) -> int:
    """``--signal-before 300`` as well as ``5m`` or ``00:05:00`` (core/units.py), never argparse's "invalid int"."""
    from torchhpc.core.units import parse_seconds
    from torchhpc.errors import SpecError

    try:
        return parse_seconds(value, "")
    except SpecError as e:
        raise argparse.ArgumentTypeError(f"{e.message.strip()} ({e.hint})") from None


def _node_count(value: str) -> int:
    """``--nodes N``; Slurm's ``MIN-MAX`` (``--nodes 2-4``) said in torchhpc's terms, not as "not a whole number"."""
    import re

    m = re.fullmatch(r"(\d+)-(\d+)", value.strip())
    if m:
        raise argparse.ArgumentTypeError(
            f"{value!r} is Slurm's min-max node count; torchhpc asks for a fixed count: --nodes {m.group(2)} "
            f"(with --min-nodes {m.group(1)}, a supervised job goes on with that many after losing nodes)")
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None


class _ExcludeAction(argparse.Action):
    """``--exclude X`` is ``--opt exclude=X`` (Slurm's --exclude), with ``@FILE`` read at parse time."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        opts = [o for o in (getattr(namespace, "opt", None) or []) if not o.startswith("exclude=")]
        namespace.opt = [*opts, "exclude=" + exclude_nodes(str(values))]


def add_job_arguments(p: argparse.ArgumentParser, *, program: bool = True) -> None:
    g = p.add_argument_group("where and how")
    g.add_argument("-s", "--scheduler", default=None, help="local (default), slurm, pbs, kubernetes, runai [TORCHHPC_SCHEDULER]")
    g.add_argument("--profile", default=None, help="site profile (torchhpc profiles list) [TORCHHPC_PROFILE]")
    g.add_argument("--launcher", default=None, choices=LAUNCHERS, help="torchrun (one task per node, default), srun (one task per process), mpirun")
    g.add_argument("-N", "--nodes", type=_node_count, default=None, help="number of nodes (default 1)")
    g.add_argument("--nproc-per-node", type=int, default=None, help="processes (ranks) per node (default: GPUs per node, else 1)")
    g.add_argument("-n", type=int, default=None, dest="nproc_short", metavar="N",
                   help="processes per node on one node; with --nodes > 1 say --nproc-per-node or --ntasks")
    g.add_argument("--ntasks", type=int, default=None, help="processes in total, divided evenly over the nodes")
    g.add_argument("--gpus-per-node", "--gpus", type=int, default=None, dest="gpus_per_node", help="GPUs per node")
    g.add_argument("--gpu-kind", choices=("nvidia", "amd"), default=None, help="GPU vendor (container flags --nv/--rocm)")
    g.add_argument("--array", default=None, metavar="SPEC",
                   help="job array, Slurm syntax: 0-15, 1,3,7, 0-31%%4 (at most 4 at once); each task gets "
                        "TORCHHPC_ARRAY_INDEX/COUNT and {index} in the program's arguments (docs/arrays.md)")
    g.add_argument("--ntasks-per-node", type=int, default=None, help="only checked: must match the launcher's geometry")
    r = p.add_argument_group("resources")
    r.add_argument("--cpus-per-proc", type=int, default=None, help="CPUs per rank (default: the profile's cpus_per_gpu x GPUs per rank, else 1); "
                        "Slurm's --cpus-per-task is derived per launcher (torchrun: ranks per node x this)")
    r.add_argument("--cpus-per-gpu", type=int, default=None, help="CPUs per GPU (e.g. 20 on MareNostrum5)")
    r.add_argument("--mem", default=None, help="memory per node, e.g. 64G")
    r.add_argument("-t", "--time", default=None, help="time limit: MM, HH:MM:SS or D-HH:MM:SS")
    r.add_argument("--name", default=None, help="job name (default: the script's name)")
    r.add_argument("--output-dir", default=None, help="where scripts and logs go: DIR/<name>-<id>/ (default: the current "
                   "directory; local jobs: torchhpc's job store, ~/.cache/torchhpc/jobs)")
    r.add_argument("-e", "--env", action="append", default=[], metavar="NAME=VALUE", help="environment variable for every rank (repeatable)")
    r.add_argument("--partition", default=None, help="Slurm partition")
    r.add_argument("--account", "-A", default=None, help="account to charge")
    r.add_argument("--qos", default=None, help="Slurm QoS")
    r.add_argument("--exclude", action=_ExcludeAction, default=None, metavar="NODES|@FILE",
                   help="keep these nodes out of the job (slurm --exclude); @FILE reads them from a file, "
                        "e.g. the one `torchhpc bench nodes --exclude-file` writes")
    r.add_argument("--queue", "-q", default=None, help="PBS queue")
    r.add_argument("--image", default=None, help="container image for kubernetes/runai")
    r.add_argument("--opt", action="append", default=[], metavar="KEY=VALUE", help="scheduler option (torchhpc options SCHEDULER lists them)")
    r.add_argument("--network", default=None, help="network preset (tcp, infiniband, roce, lumi-slingshot, debug) or auto")
    n = p.add_argument_group("nothing lost (slurm)")
    n.add_argument("--signal-before", type=_lead_time, default=None, metavar="SECONDS",
                   help="ask ranks to checkpoint and stop this long before the time limit (default min(300, limit/2); 0: off)")
    n.add_argument("--requeue", action="store_true", help="after a time-limit or preemption stop, requeue the job")
    n.add_argument("--max-requeues", type=int, default=3, help="cap on time-limit requeues (preemptions are not capped)")
    s = p.add_argument_group("resilience (docs/resilience.md)")
    s.add_argument("--spares", type=int, default=None, metavar="K",
                   help="allocate K spare nodes beside --nodes; after a node failure the job goes on on them, "
                        "in the same allocation (slurm, pbs)")
    s.add_argument("--min-nodes", type=int, default=None, metavar="M",
                   help="after a node loss with no spare left, go on with the nodes that are left, at least M: "
                        "the job shrinks instead of ending (slurm; needs --max-restarts; docs/resilience.md)")
    s.add_argument("--max-restarts", type=int, default=None, metavar="R",
                   help="restart the launch at most R times after a node failure, hang or network error "
                        "(never after an exception in the program); 0: never")
    s.add_argument("--max-no-progress", type=int, default=None, metavar="K",
                   help="end the job (class no-progress) after K attempts in a row that saved no newer checkpoint "
                        "(default 3; 0: never)")
    s.add_argument("--checkpoint-dir", default=None, metavar="DIR",
                   help="where the program saves checkpoints: the newest file's step tells the supervisor it advanced "
                        "(torchhpc.dist.checkpoint tells it by itself)")
    s.add_argument("--on-restart-append", default=None, metavar="ARGS",
                   help="arguments added to the program on attempts after the first; {latest:GLOB} becomes the "
                        "newest match, e.g. '--resume_from_checkpoint {latest:ckpt/checkpoint-*}'")
    s.add_argument("--flight-recorder", default=None, metavar="N|off",
                   help="collectives each rank's torch Flight Recorder keeps, dumped into the job directory "
                        "when a hang is named (default 2000; off: none); docs/diagnose.md")
    c = p.add_argument_group("container")
    c.add_argument("--container", default=None, metavar="IMAGE", help="run every rank inside this image (SIF, docker://..., image name, or directory)")
    c.add_argument("--runtime", default=None, choices=RUNTIMES, help="container runtime (default apptainer, or the profile's)")
    c.add_argument("--no-container", action="store_true",
                   help="run on the host even when the profile names a container runtime")
    c.add_argument("--bind", action="append", default=[], metavar="SRC[:DST[:ro]]", help="bind mount (repeatable)")
    c.add_argument("--container-env", action="append", default=[], metavar="NAME", help="extra variable to pass into the container")
    c.add_argument("--cleanenv", action="store_true", help="apptainer/singularity --cleanenv")
    if program:  # run and sweep: a job that starts after others (core/depend.py)
        d = p.add_argument_group("dependencies (slurm, pbs, local)")
        d.add_argument("--after-ok", "--after", action="append", default=[], dest="after_ok", metavar="JOB[,JOB...]",
                       help="start after these jobs ended well (ids or handles such as slurm:123); "
                            "if one fails, this job never starts and status says so")
        d.add_argument("--after-any", action="append", default=[], metavar="JOB[,JOB...]",
                       help="start after these jobs ended, however they ended")
        d.add_argument("--after-fail", action="append", default=[], metavar="JOB[,JOB...]",
                       help="start after these jobs failed (e.g. a clean-up or a report of the failure)")
        x = p.add_argument_group("program")
        x.add_argument("--python", default=None, help="interpreter for the ranks (default: this one; 'python' in containers)")
        x.add_argument("-m", "--module", default=None, help="run a module as `python -m MODULE`")


def split_program(parser: argparse.ArgumentParser, argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Split ``argv`` into torchhpc's flags and the program with its arguments.

    The program starts at the first word that is not a flag or a flag's value,
    right after ``-m MODULE``, or after ``--``. After it, only ``--wait``,
    ``--dry-run`` and ``--rank0-only`` are still ours (so ``... pi.py --wait``
    works); nccl-tests' ``-e 64M`` or ``-n 20`` go to the program.
    """
    takes_value = {opt: action.nargs != 0 for action in parser._actions for opt in action.option_strings}
    head: list[str] = []
    program: list[str] = []
    argv = list(argv)
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            return head, argv[i + 1 :]
        if tok.startswith("-") and tok != "-":
            name = tok.split("=", 1)[0]
            head.append(tok)
            if takes_value.get(name) and "=" not in tok:
                if i + 1 < len(argv):
                    head.append(argv[i + 1])
                i += 2
                if name in ("-m", "--module"):
                    break
                continue
            i += 1
            if name in ("-m", "--module") and "=" in tok:
                break
            continue
        break
    rest = argv[i:]
    seen_dashdash = False
    for tok in rest:
        if not seen_dashdash and tok == "--" and program:
            seen_dashdash = True
            program.append(tok)
        elif not seen_dashdash and tok in TRAILING_FLAGS:
            head.append(tok)
        else:
            program.append(tok)
    return head, program


def misplaced_flags(parser: argparse.ArgumentParser, argv: Sequence[str], program: Sequence[str]) -> list[str]:
    """torchhpc's own long flags that follow the program (``run train.py --nodes 2``): they go to the
    program, as with torchrun, but a user who meant them for torchhpc deserves one warning line.

    None when the program came after an explicit ``--`` (the user said where ours end), and none for
    ``-m torchhpc...`` (our own tools take flags of the same name: ``torchhpc.bench --json``). Short
    flags (``-n``, ``-N``) only after a Python script: other programs (nccl-tests' ``-n 20``) use them for
    their own things far too often, and ``--`` before the program says the user knows.
    """
    argv = list(argv)
    if "--" in argv[: len(argv) - len(program)]:
        return []
    module = next((argv[i + 1] for i, w in enumerate(argv[:-1]) if w in ("-m", "--module")), "")
    if module.startswith("torchhpc"):
        return []
    script = bool(program) and program[0].endswith(".py")
    ours = {o for a in parser._actions for o in a.option_strings if o.startswith("--") or script} - set(TRAILING_FLAGS)
    ours -= {"--help", "-h"}
    return [w for w in program[1:] if w.split("=", 1)[0] in ours]


def spec_from_args(args: argparse.Namespace, program: Sequence[str]) -> JobSpec:
    """Typed config from parsed flags (+ TORCHHPC_* variables, profile, config file): see :mod:`torchhpc.resolve`.

    In a dry run, refusals that only matter at submission are printed as warnings.
    """
    from torchhpc.errors import UsageError
    from torchhpc.resolve import build_spec

    def warn(e: UsageError) -> None:
        from torchhpc.resolve import Notice

        stop = "" if isinstance(e, Notice) else " (submitting would stop here)"
        print(f"Warning: {e.message}{stop}", file=sys.stderr)
        if e.hint:
            print(f"HINT: {e.hint}", file=sys.stderr)

    values = dict(vars(args))
    values["cpus_per_task"] = values.pop("cpus_per_proc", None)
    return build_spec(values, program, preview=warn if getattr(args, "dry_run", False) else None)
