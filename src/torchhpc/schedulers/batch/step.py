"""What the launch step runs, for every batch backend: the job's container (one per task) and the
variables its ranks need by name, torchrun's per-node command, a job array's task arguments, and
where a long launch line breaks for a reader.

:mod:`~torchhpc.schedulers.batch.base` assembles the script around these; the backends
(:mod:`~torchhpc.schedulers.slurm.slurm`, :mod:`~torchhpc.schedulers.pbs.pbs`) call them in their
launch lines.
"""

from __future__ import annotations

import os
from dataclasses import replace

from torchhpc.core.shell import Raw, join, quote, split_words
from torchhpc.core.spec import ContainerSpec, JobSpec, default_python
from torchhpc.launchers import torchrun_argv
from torchhpc.launchers.boot import BOOT_VAR

__all__ = [
    "RUNTIMES",
    "SUB_LINES",
    "array_lines",
    "in_container",
    "job_container",
    "job_env_names",
    "launch_breaks",
    "torchrun_command",
]


def job_container(spec: JobSpec, container: ContainerSpec) -> ContainerSpec:
    """The job's container, with the output directory bound: its ranks read torchhpc's boot copy there
    (script.job_boot), the stop file, and write their log files from inside (torchrun's workers, pyxis)."""
    out = os.path.abspath(spec.output_dir)
    if not any(b.split(":")[0] == out for b in container.binds):
        return replace(container, binds=(*container.binds, out))
    return container


def job_env_names(spec: JobSpec) -> list[str]:
    """The variables every rank must receive by name: the user's ``--env`` and the ``--network``
    presets' (set by the script with setdefault, so not in the job's env). Launchers and runtimes
    that do not pass the whole environment on (``mpirun -x``, ``pbsdsh env``, podman) list these."""
    names = dict.fromkeys(spec.env_dict)
    if spec.array is not None:
        names.update(dict.fromkeys(("TORCHHPC_ARRAY_INDEX", "TORCHHPC_ARRAY_COUNT")))
    if spec.network:
        from torchhpc.network.presets import preset_env

        names.update(dict.fromkeys(preset_env(spec.network)))
    return list(names)


def in_container(spec: JobSpec, argv: list[str], pass_env: list[str], interactive: bool = False) -> list[str]:
    """Run ``argv`` inside the job's container (one container per task), if any.

    ``pass_env`` names the variables (globs allowed) the ranks need from the
    batch shell; the user's ``--env`` names are always added.
    """
    if spec.container is None:
        return argv
    from torchhpc.containers import wrap

    return wrap(
        job_container(spec, spec.container),
        argv,
        gpus=spec.gpus_per_node,
        gpu_kind=spec.gpu_kind,
        pass_env=[*pass_env, "TORCHHPC_*", *job_env_names(spec)],
        interactive=interactive,
        boot_var=BOOT_VAR,
    )


def torchrun_command(
    spec: JobSpec, python: str, *, nnodes: Raw, rdzv_id: Raw, worker_shim: Raw | None = None
) -> list[str]:
    """One torchrun per node, c10d rendezvous at the job's MASTER_ADDR:MASTER_PORT, output tagged per rank.

    ``worker_shim``: start each worker through the per-task shim (see torchrun_argv).
    """
    endpoint = Raw('"$MASTER_ADDR:$MASTER_PORT"')
    return torchrun_argv(
        spec, python, nnodes=nnodes, rdzv_id=rdzv_id, endpoint=endpoint, extra=["--tee", "3"], worker_shim=worker_shim
    )


# {NAME} -> VALUE in every program argument, in the task itself: plain text, nothing is re-parsed
# (the quoted pattern is literal; a replacement is never a pattern or an "&" reference).
SUB_LINES = (
    "_torchhpc_sub() {",
    "  local _i _a _o",
    '  for _i in "${!_torchhpc_args[@]}"; do',
    '    _a=${_torchhpc_args[_i]} _o=""',
    '    while [[ $_a == *"{$1}"* ]]; do _o+=${_a%%"{$1}"*}$2; _a=${_a#*"{$1}"}; done',
    '    _torchhpc_args[_i]=$_o$_a',
    "  done",
    "}",
)


def array_lines(spec: JobSpec, index_ref: str) -> tuple[list[str], JobSpec]:
    """A job array's task: TORCHHPC_ARRAY_INDEX/COUNT exported, and ``{index}`` (and a sweep's
    ``{NAME}``) replaced in the program's arguments at run time. The arguments become a bash
    array the launch expands as ``"${_torchhpc_args[@]}"`` (each element one exact argv word)."""
    arr = spec.array_spec
    assert arr is not None
    lines = [
        "# Job array: this task's index and the number of tasks, for every rank (docs/arrays.md).",
        f"export TORCHHPC_ARRAY_INDEX={index_ref} TORCHHPC_ARRAY_COUNT={arr.count}",
    ]
    names = ["index", *(name for name, _ in spec.array_params)]
    args = spec.entrypoint.args
    lead = args[:1] if args[:1] == ("--",) else ()
    rest = args[len(lead):]
    if not any("{" + n + "}" in a for a in rest for n in names):
        return lines, spec
    for name, values in spec.array_params:
        cells = " ".join(f"[{i}]={quote(v)}" for i, v in zip(arr.indices, values))
        lines.append(f"_torchhpc_p_{name}=({cells})")
    lines += [f"_torchhpc_args=({join(list(rest))})", *SUB_LINES, '_torchhpc_sub index "$TORCHHPC_ARRAY_INDEX"']
    lines += [f'_torchhpc_sub {n} "${{_torchhpc_p_{n}[$TORCHHPC_ARRAY_INDEX]}}"' for n, _ in spec.array_params]
    entry = replace(spec.entrypoint, args=(*lead, Raw('"${_torchhpc_args[@]}"')))
    return lines, spec.with_(entrypoint=entry)


def launch_breaks(line: str, spec: JobSpec) -> list[int]:
    """Where the launch command's lines start: each command of the wrapper chain on a line of its own
    (the log wrapper, a container runtime, torchrun, the task shim, the program)."""
    words = split_words(line)
    program = [quote(w) for w in spec.entrypoint.argv(default_python(spec))]
    script = [quote(w) for w in spec.entrypoint.script_argv()]
    out: list[int] = []
    for i, w in enumerate(words):
        if i == 0:
            continue
        nxt = words[i + 1 : i + 3]
        if (w == "bash" and nxt[:1] and (nxt[0] == "-c" or nxt[0].endswith((".sh", '.sh"')))) \
                or nxt == ["-m", "torch.distributed.run"] or (w in RUNTIMES and not words[i - 1].endswith('gpus.sh"')):
            out.append(i)
        elif i >= 2 and words[i - 2].endswith(("rank.sh", 'rank.sh"')):
            out.append(i)
    for prog in (program, script):
        n = len(prog)
        if n and words[-n:] == prog and len(words) - n not in out:
            out.append(len(words) - n)
            break
    return sorted(out)


# container runtimes' commands: a launch line breaks before them
RUNTIMES = frozenset({"apptainer", "singularity", "ch-run", "podman", "docker", "enroot"})
