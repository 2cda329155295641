"""``torchhpc container``: image recipes, base-image constraints, conversions, wrapped commands.

    torchhpc container recipe --base nvcr.io/nvidia/pytorch:24.03-py3 --requirements requirements.txt \\
        --format docker|apptainer [--multi-stage] [--output DIR]
    torchhpc container constraints [--output FILE] [--python PY]
    torchhpc container convert IMAGE --to sif|sqsh|dir [--from docker|podman] [--run]
    torchhpc container wrap --runtime podman --container IMAGE -- python train.py
    torchhpc container options RUNTIME
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from torchhpc.cli.common import add_subparser, after_dashdash, env_default, eprint, help_when_bare
from torchhpc.core.spec import RUNTIMES, ContainerSpec
from torchhpc.core.units import plural
from torchhpc.errors import UsageError


def register(sub: Any) -> None:
    p = add_subparser(
        sub,
        "container",
        "image recipes that keep the base image's torch, constraints, conversions",
        __doc__,
    )
    csub = p.add_subparsers(dest="container_command", metavar="ACTION")
    help_when_bare(p)

    r = add_subparser(csub, "recipe", "write a Dockerfile or Apptainer definition that keeps the base's torch")
    r.add_argument("--base", default=env_default("--base", "nvcr.io/nvidia/pytorch:24.03-py3"),
                   help="base image (default nvcr.io/nvidia/pytorch:24.03-py3; $TORCHHPC_BASE)")
    r.add_argument("--requirements", default="requirements.txt",
                   help="requirements file in the build directory (default requirements.txt)")
    r.add_argument("--format", choices=("docker", "apptainer"), default="docker", help="recipe format")
    r.add_argument("--multi-stage", action="store_true",
                   help="build wheels in a first stage, install only them in the final image")
    r.add_argument("--tag", default="my-image", help="image name used in the build command shown")
    r.add_argument("--output", "-o", metavar="DIR",
                   help="write the recipe and its helper into DIR (default: print the recipe)")
    r.add_argument("--force", action="store_true", help="with --output: replace files of the same names already there")
    r.set_defaults(func=cmd_recipe)

    c = add_subparser(csub, "constraints", "print pip constraints pinning every package of this environment")
    c.add_argument("--output", "-o", metavar="FILE", help="write to FILE instead of stdout")
    c.add_argument("--merge", metavar="FILE", help="also merge FILE (default /etc/pip/constraint.txt if present)")
    c.add_argument("--no-merge", action="store_true", help="do not merge /etc/pip/constraint.txt")
    c.add_argument("--python", metavar="PY",
                   help="freeze this interpreter's environment instead (e.g. a venv's or the image's python)")
    c.set_defaults(func=cmd_constraints)

    v = add_subparser(csub, "convert", "print (or --run) the steps that convert a local image to SIF/squashfs/dir")
    v.add_argument("image", help="local Docker/Podman image, e.g. mn5 or localhost/my-image:latest")
    v.add_argument("--to", choices=("sif", "sqsh", "dir"), default="sif",
                   help="sif: apptainer/singularity; sqsh: enroot/pyxis; dir: charliecloud")
    v.add_argument("--from", dest="source", choices=("docker", "podman"), default="docker", help="image store")
    v.add_argument("--output", "-o", help="output path (default: from the image name)")
    v.add_argument("--runtime", choices=("apptainer", "singularity"), default="apptainer",
                   help="SIF builder (the seeds' sites load `module load singularity`)")
    v.add_argument("--keep-tar", action="store_true", help="keep the docker-archive tar")
    v.add_argument("--run", action="store_true", help="run the steps instead of printing them")
    v.set_defaults(func=cmd_convert)

    w = add_subparser(csub, "wrap", "print the command that runs COMMAND in a container (what each task runs)")
    w.add_argument("--container", required=True, metavar="IMAGE")
    w.add_argument("--runtime", choices=RUNTIMES, default="apptainer")
    w.add_argument("--bind", action="append", default=[], metavar="SRC[:DST[:ro]]")
    w.add_argument("--container-env", action="append", default=[], metavar="NAME[=VALUE]")
    w.add_argument("--container-opt", action="append", default=[], metavar="KEY=VALUE",
                   help="runtime option (see `torchhpc container options RUNTIME`)")
    w.add_argument("--cleanenv", action="store_true")
    w.add_argument("--workdir")
    w.add_argument("--gpus", type=int, default=0)
    w.add_argument("--gpu-kind", choices=("nvidia", "amd"), default="nvidia")
    w.add_argument("--pass-env", action="append", default=[], metavar="NAME|PREFIX*")
    w.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ...")
    w.set_defaults(func=cmd_wrap)

    o = add_subparser(csub, "options", "list a runtime's options (ContainerSpec.options)")
    o.add_argument("runtime", choices=RUNTIMES)
    o.set_defaults(func=cmd_options)


def cmd_recipe(args: argparse.Namespace) -> int:
    from torchhpc.containers.recipe import render
    from torchhpc.core.shell import quote

    recipe = render(args.base, args.requirements, args.format, args.multi_stage, args.tag)
    if not args.output:
        sys.stdout.write(recipe.text)
        eprint(f"# also needs {', '.join(recipe.files)} beside it: use --output DIR to write both")
        return 0
    files = {os.path.join(args.output, name): text for name, text in {recipe.filename: recipe.text, **recipe.files}.items()}
    taken = [path for path in files if os.path.lexists(path)]
    if taken and not args.force:  # a Dockerfile in a project directory is usually the user's own
        raise UsageError(
            f"--output {args.output}: {', '.join(taken)} already {plural(len(taken), 'exists', 'exist')}; torchhpc does not overwrite them",
            "give another --output DIR, or add --force to replace them",
        )
    try:
        os.makedirs(args.output, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--output {args.output}: cannot create it ({e.strerror})",
                         "give a directory you can write, e.g. --output build/") from None
    for path, text in files.items():
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        print(path)
    if not os.path.exists(os.path.join(args.output, args.requirements)):
        eprint(f"note: copy {args.requirements} into {args.output} before building")
    eprint(f"build: cd {quote(args.output)} && {recipe.build_command}")
    return 0


def cmd_constraints(args: argparse.Namespace) -> int:
    from torchhpc.containers import constraints

    argv = []
    if args.output:
        argv += ["--output", args.output]
    if args.merge:
        argv += ["--merge", args.merge]
    if args.no_merge:
        argv.append("--no-merge")
    if not args.python:
        return constraints.main(argv)
    from torchhpc.core.proc import default_runner

    done = default_runner().run([args.python, constraints.__file__, *argv], timeout=120)
    sys.stdout.write(done.stdout)
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    from torchhpc.containers.convert import run_steps, steps
    from torchhpc.core.shell import join

    cmds = steps(args.image, args.to, source=args.source, output=args.output,
                 runtime=args.runtime, keep_tar=args.keep_tar)
    if not args.run:
        for argv in cmds:
            print(join(argv))
        return 0
    from torchhpc.core.proc import default_runner

    runner = default_runner()
    for argv in cmds:
        eprint("+ " + join(argv))
        run_steps([argv], runner)
    return 0


def cmd_wrap(args: argparse.Namespace) -> int:
    from torchhpc.containers import setup_lines, srun_options, wrap
    from torchhpc.core.shell import join
    from torchhpc.launchers.builders import srun_step

    command = after_dashdash(args.command)
    if not command:
        raise UsageError("no command to wrap", "add -- COMMAND ...")
    opts = []
    for item in args.container_opt:
        if "=" not in item:
            raise UsageError(f"--container-opt {item!r} is not KEY=VALUE")
        k, v = item.split("=", 1)
        opts.append((k, v))
    spec = ContainerSpec(args.container, args.runtime, tuple(args.bind), tuple(args.container_env),
                         args.workdir, args.cleanenv, tuple(opts))
    for line in setup_lines(spec):
        print(line)
    srun = srun_options(spec)
    argv = wrap(spec, command, gpus=args.gpus, gpu_kind=args.gpu_kind, pass_env=args.pass_env)
    print(join(srun_step(srun, argv) if srun else argv))
    return 0


def cmd_options(args: argparse.Namespace) -> int:
    from torchhpc.containers import runtime_options

    opts = runtime_options(args.runtime)
    width = max(len(k) for k in opts)
    for key, help in opts.items():
        print(f"  {key:<{width}}  {help}")
    return 0
