"""The job flags shared by ``run``, ``shell`` and ``bench sweep``, and their mapping to a JobSpec.

Precedence for every value: command line > ``TORCHHPC_*`` variable > ``--profile`` > built-in default.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from typing import Any

from torchhpc.core.shell import Raw
from torchhpc.core.spec import LAUNCHERS, RUNTIMES, ContainerSpec, Entrypoint, JobSpec, env_pairs
from torchhpc.errors import UsageError

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
    g.add_argument("-N", "--nodes", type=int, default=None, help="number of nodes (default 1)")
    g.add_argument("-n", "--nproc-per-node", type=int, default=None, help="processes (ranks) per node (default: GPUs per node, else 1)")
    g.add_argument("--gpus-per-node", "--gpus", type=int, default=None, dest="gpus_per_node", help="GPUs per node")
    g.add_argument("--gpu-kind", choices=("nvidia", "amd"), default=None, help="GPU vendor (container flags --nv/--rocm)")
    g.add_argument("--ntasks-per-node", type=int, default=None, help="only checked: must match the launcher's geometry")
    r = p.add_argument_group("resources")
    r.add_argument("--cpus-per-proc", type=int, default=None, help="CPUs per rank (torchhpc sets Slurm's --cpus-per-task per launcher)")
    r.add_argument("--cpus-per-gpu", type=int, default=None, help="CPUs per GPU (e.g. 20 on MareNostrum5)")
    r.add_argument("--mem", default=None, help="memory per node, e.g. 64G")
    r.add_argument("-t", "--time", default=None, help="time limit: MM, HH:MM:SS or D-HH:MM:SS")
    r.add_argument("--name", default=None, help="job name (default: the script's name)")
    r.add_argument("--output-dir", default=None, help="where scripts and logs go (default: current directory)")
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
    n.add_argument("--signal-before", type=int, default=None, metavar="SECONDS",
                   help="ask ranks to checkpoint and stop this long before the time limit (default min(300, limit/2); 0: off)")
    n.add_argument("--requeue", action="store_true", help="after a time-limit or preemption stop, requeue the job")
    n.add_argument("--max-requeues", type=int, default=3, help="cap on time-limit requeues (preemptions are not capped)")
    c = p.add_argument_group("container")
    c.add_argument("--container", default=None, metavar="IMAGE", help="run every rank inside this image (SIF, docker://..., image name, or directory)")
    c.add_argument("--runtime", default=None, choices=RUNTIMES, help="container runtime (default apptainer)")
    c.add_argument("--bind", action="append", default=[], metavar="SRC[:DST[:ro]]", help="bind mount (repeatable)")
    c.add_argument("--container-env", action="append", default=[], metavar="NAME", help="extra variable to pass into the container")
    c.add_argument("--cleanenv", action="store_true", help="apptainer/singularity --cleanenv")
    if program:
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
    takes_value: dict[str, bool] = {}
    for action in parser._actions:
        for opt in action.option_strings:
            takes_value[opt] = action.nargs != 0
    head: list[str] = []
    program: list[str] = []
    argv = list(argv)
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            program = argv[i + 1 :]
            return head, program
        if tok.startswith("-") and tok != "-":
            name = tok.split("=", 1)[0]
            head.append(tok)
            if name in takes_value and takes_value[name] and "=" not in tok:
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


def _pick(cli: Any, env_name: str, profile: Any, attr: str, default: Any = None, cast: Any = None) -> Any:
    import os

    if cli is not None:
        return cli
    if env_name in os.environ:
        v = os.environ[env_name]
        return cast(v) if cast else v
    if profile is not None and getattr(profile, attr, None) not in (None, (), ""):
        return getattr(profile, attr)
    return default


def spec_from_args(args: argparse.Namespace, program: Sequence[str]) -> JobSpec:
    """Typed config from parsed flags (+ TORCHHPC_* variables + profile)."""
    import os

    profile = None
    profile_name = args.profile or os.environ.get("TORCHHPC_PROFILE")
    if profile_name:
        from torchhpc.profiles import get_profile

        profile = get_profile(profile_name)
    scheduler = _pick(args.scheduler, "TORCHHPC_SCHEDULER", profile, "scheduler", "local")
    gpus = _pick(args.gpus_per_node, "TORCHHPC_GPUS_PER_NODE", profile, "gpus_per_node", 0, int)
    nproc = _pick(args.nproc_per_node, "TORCHHPC_NPROC_PER_NODE", None, "", gpus or 1, int)
    module = getattr(args, "module", None)
    python = getattr(args, "python", None)
    entry = Entrypoint.parse(program, module=module, python=python)
    name = args.name or _default_name(entry)
    options: dict[str, str] = {}
    for key, attr in (("partition", "partition"), ("account", "account"), ("qos", "qos"), ("queue", "queue"), ("image", "image")):
        v = _pick(getattr(args, attr), f"TORCHHPC_{attr.upper()}", profile, attr)
        if v:
            options[key] = str(v)
    if profile is not None:
        for k, v in getattr(profile, "options", ()) or ():
            options.setdefault(str(k), str(v))
    if profile is not None and getattr(profile, "cpu_bind", None):
        options.setdefault("cpu_bind", str(profile.cpu_bind))
    for item in args.opt:
        if "=" not in item:
            raise UsageError(f"--opt {item!r} is not KEY=VALUE", "e.g. --opt constraint=a100")
        k, v = item.split("=", 1)
        options[k] = v
    if profile is not None:
        for req in getattr(profile, "require", ()) or ():
            if req not in options:
                raise UsageError(
                    f"profile {profile_name!r} requires --{req} (the site rejects jobs without it)",
                    f"add --{req} NAME",
                )
    env = dict(getattr(profile, "env", ()) or ()) if profile is not None else {}
    network = _pick(args.network, "TORCHHPC_NETWORK", profile, "network")
    if network and network != "auto":
        from torchhpc.network.presets import preset_env

        for k, v in preset_env(network).items():
            env.setdefault(k, v)
    env.update(env_pairs(args.env))
    container = None
    image = args.container or os.environ.get("TORCHHPC_CONTAINER")
    if not image and profile is not None and options.get("image") is None:
        image = getattr(profile, "container_image", None)
    if image and re.fullmatch(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?", image):
        # A site variable such as LUMI's $SIF (set by its container module): expand it in the job.
        image = Raw(f'"{image}"')
    if image:
        runtime = _pick(args.runtime, "TORCHHPC_RUNTIME", profile, "container_runtime", "apptainer")
        container = ContainerSpec(
            image=image,
            runtime=runtime,
            binds=tuple(args.bind),
            env=tuple(args.container_env),
            cleanenv=bool(args.cleanenv),
        )
    setup: tuple[str, ...] = ()
    if profile is not None:
        setup = tuple(getattr(profile, "setup", ()) or ())
        if container is not None:
            setup += tuple(getattr(profile, "container_setup", ()) or ())
    return JobSpec(
        entrypoint=entry,
        nodes=_pick(args.nodes, "TORCHHPC_NODES", None, "", 1, int),
        nproc_per_node=nproc,
        gpus_per_node=gpus,
        gpu_kind=_pick(args.gpu_kind, "TORCHHPC_GPU_KIND", profile, "gpu_kind", "nvidia"),
        cpus_per_task=args.cpus_per_proc,
        cpus_per_gpu=_pick(args.cpus_per_gpu, "TORCHHPC_CPUS_PER_GPU", profile, "cpus_per_gpu", None, int),
        mem=_pick(args.mem, "TORCHHPC_MEM", profile, "mem"),
        time=_pick(args.time, "TORCHHPC_TIME", profile, "time"),
        name=name,
        output_dir=_pick(args.output_dir, "TORCHHPC_OUTPUT_DIR", None, "", "."),
        env=tuple(env.items()),
        # PBS sites run the seed's `mpirun + python` pattern; everywhere else torchrun is the default.
        launcher=_pick(args.launcher, "TORCHHPC_LAUNCHER", profile, "launcher", "mpirun" if scheduler == "pbs" else "torchrun"),
        container=container,
        scheduler=scheduler,
        options=tuple(options.items()),
        ntasks_per_node=args.ntasks_per_node,
        network=network,
        setup=setup,
        signal_before=args.signal_before,
        requeue=bool(args.requeue),
        max_timeout_requeues=args.max_requeues,
    )


def _default_name(entry: Entrypoint) -> str:
    import os

    base = os.path.basename(entry.target)
    return (base[:-3] if base.endswith(".py") else base.replace(".", "-")) or "torchhpc"
