"""The job description: frozen dataclasses, validated once, shared by every backend.

A :class:`JobSpec` says *what* the user wants (entrypoint, geometry, resources,
launcher, container, scheduler options); schedulers and launchers turn it into
*how*. Validation lives here so every path rejects the same bad input with the
same message. The launcher's typed name, :class:`~torchhpc.core.launcher_kind.LauncherKind`,
is a vocabulary of its own (core/launcher_kind.py).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal, Optional

from torchhpc.core.array import ArraySpec, check_placeholders, parse_array
from torchhpc.core.depend import Dependency
from torchhpc.core.gpus import requested_geometry_error
from torchhpc.core.handle import Handle
from torchhpc.core.launcher_kind import LauncherKind
from torchhpc.core.units import parse_size, parse_timeout, parse_walltime
from torchhpc.core.validate import check_name, check_value
from torchhpc.errors import SpecError

__all__ = [
    "RUNTIMES",
    "ContainerSpec",
    "Entrypoint",
    "JobSpec",
    "default_python",
]


RUNTIMES = ("apptainer", "singularity", "pyxis", "enroot", "docker", "podman", "charliecloud")
EntryKind = Literal["script", "module", "command"]


@dataclass(frozen=True)
class Entrypoint:
    """What each rank runs: a Python script, a ``-m`` module, or any command.

    ``python`` is the interpreter used for scripts and modules; ``None`` means
    the backend's default (the submitting interpreter outside containers,
    ``python`` inside them).
    """

    kind: EntryKind
    target: str
    args: tuple[str, ...] = ()
    python: Optional[str] = None

    @classmethod
    def parse(cls, argv: Sequence[str], module: str | None = None, python: str | None = None) -> Entrypoint:
        """``["train.py", "--lr", "1"]`` -> script; ``module="pkg.mod"`` -> module; else a command."""
        argv = list(argv)
        if module is not None:
            return cls("module", module, tuple(argv), python)
        if not argv:
            raise SpecError("no program to run", "give a script (train.py), -m module, or -- COMMAND ...")
        head = argv[0]
        if head.endswith(".py"):
            return cls("script", head, tuple(argv[1:]), python)
        return cls("command", head, tuple(argv[1:]), python)

    def __post_init__(self) -> None:
        field = {"script": "program", "module": "-m/--module", "command": "program"}[self.kind]
        check_value(self.target, field, word=True, empty=False)
        if self.kind != "script" and "=" in self.target:
            raise SpecError(
                f"{field} {self.target[:60]!r} contains '=': a shell would read it as a variable assignment",
                "set variables with --env NAME=VALUE, or give the program's path",
            )
        if self.python is not None:
            check_value(self.python, "--python", word=True, empty=False)
            if "=" in self.python:
                raise SpecError(f"--python {self.python[:60]!r} contains '='", "give the interpreter's name or path")
        for arg in self.args:
            check_value(arg, "program argument")

    def argv(self, python: str = "python") -> list[str]:
        py = self.python or python
        if self.kind == "script":
            return [py, self.target, *self.args]
        if self.kind == "module":
            return [py, "-m", self.target, *self.args]
        return [self.target, *self.args]

    def script_argv(self) -> list[str]:
        """What torchrun takes after its own flags (it adds the interpreter itself)."""
        # torchrun's parser drops a "--" right after the script; a "--" of ours before
        # the script makes it keep the program's own.
        guard = ["--"] if self.args[:1] == ("--",) else []
        if self.kind == "script":
            return [*guard, self.target, *self.args]
        if self.kind == "module":
            return ["-m", *guard, self.target, *self.args]
        return ["--no-python", *guard, self.target, *self.args]


@dataclass(frozen=True)
class ContainerSpec:
    image: str
    runtime: str = "apptainer"
    binds: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    workdir: Optional[str] = None
    cleanenv: bool = False
    options: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.runtime not in RUNTIMES:
            raise SpecError(
                f"--runtime {self.runtime!r} is not a container runtime",
                f"choose one of: {', '.join(RUNTIMES)}",
            )
        if not self.image:
            raise SpecError("--container needs an image", "give a SIF path, docker:// URI or image name")
        # An image is a positional word of every runtime's command line: "--privileged" must not become a flag.
        check_value(self.image, "--container", line=True, word=True)
        for b in self.binds:
            check_value(b, "--bind", line=True)
            if not b or b.count(":") > 2:
                raise SpecError(f"--bind {b!r} is not SRC[:DST[:ro]]")
        for item in self.env:
            check_value(item, "--container-env")
        if self.workdir is not None:
            check_value(self.workdir, "container workdir", line=True, word=True, empty=False)
        for key, value in self.options:
            check_value(value, f"container option {key}", line=True)


# Scheduler options that have a flag of their own: an error names the flag the user typed, not --opt.
OPTION_FLAGS = {"partition": "--partition", "account": "--account", "qos": "--qos", "queue": "--queue",
                "image": "--image", "exclude": "--exclude"}


@dataclass(frozen=True)
class JobSpec:
    """One distributed job, independent of where it runs."""

    entrypoint: Entrypoint
    nodes: int = 1
    nproc_per_node: int = 1
    gpus_per_node: int = 0
    gpu_kind: Literal["nvidia", "amd"] = "nvidia"
    cpus_per_task: Optional[int] = None
    cpus_per_gpu: Optional[int] = None
    mem: Optional[str] = None
    time: Optional[str] = None
    name: str = "torchhpc"
    output_dir: str = "."
    env: tuple[tuple[str, str], ...] = ()
    # a plain string ("srun") is accepted and converted in __post_init__
    launcher: LauncherKind = LauncherKind.TORCHRUN
    container: Optional[ContainerSpec] = None
    scheduler: str = "local"
    options: tuple[tuple[str, str], ...] = ()
    ntasks_per_node: Optional[int] = None
    network: Optional[str] = None
    setup: tuple[str, ...] = ()
    # Nothing lost: seconds before the time limit at which ranks are asked to
    # checkpoint and stop (None: default when a time limit is set; 0: off),
    # and whether the job requeues itself afterwards.
    signal_before: Optional[int] = None
    requeue: bool = False
    max_timeout_requeues: int = 3
    # Resilience (docs/resilience.md): K spare nodes allocated beside the N the launch uses, and
    # restarts inside the allocation after a node failure, hang or network error; the hang watch's
    # quiet seconds for the in-allocation supervisor (None: no hang watch in the allocation).
    spares: int = 0
    # After a node loss with no spare left, go on with fewer nodes, at least this many (None: never shrink).
    min_nodes: Optional[int] = None
    max_restarts: int = 0
    hang_timeout: Optional[float] = None
    # The no-progress stop (supervisor/progress.py) and what a restarted attempt adds to the program
    # (supervisor/resume.py: {latest:GLOB} becomes the newest match when the attempt starts).
    max_no_progress: int = 3
    checkpoint_dir: Optional[str] = None
    on_restart_append: str = ""
    # Job array (Slurm syntax, core/array.py) and a sweep's parameters: NAME -> one value per task, in index order.
    array: Optional[str] = None
    array_params: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # Start only after these jobs of the same scheduler (core/depend.py: --after-ok/--after-any/--after-fail).
    after: tuple[Dependency, ...] = ()

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise SpecError(f"--nodes={self.nodes} must be at least 1", "give the nodes to run on: --nodes 1 or more")
        # GPUs first: processes per node default to them, so a bad --gpus-per-node must be named as itself.
        if self.gpus_per_node < 0:
            raise SpecError(
                f"--gpus-per-node={self.gpus_per_node} must not be negative",
                "give the GPUs each node uses (0, or leave it out, for a CPU job)",
            )
        if self.nproc_per_node < 1:
            raise SpecError(f"--nproc-per-node={self.nproc_per_node} must be at least 1",
                            "give the ranks per node: -n 2 (--nproc-per-node 2); leave it out for one per GPU")
        object.__setattr__(self, "launcher", LauncherKind.parse(self.launcher))
        if self.time is not None:
            parse_walltime(self.time, "--time")
        if self.mem is not None:
            if re.fullmatch(r"\s*\d+(?:\.\d+)?\s*", str(self.mem)):
                # sbatch reads a bare number as megabytes, qsub as bytes: never guess which was meant.
                raise SpecError(
                    f"--mem={self.mem!r} has no unit (Slurm would read {self.mem} MB, PBS {self.mem} bytes)",
                    f"write the unit: --mem {str(self.mem).strip()}G (or M, T)",
                )
            parse_size(self.mem, "--mem")
        check_value(self.name, "--name", line=True, empty=False, max_len=200)
        check_value(self.output_dir, "--output-dir", line=True, empty=False)
        for k, v in self.env:
            check_name(k, "--env")
            check_value(v, f"--env {k}")
        for k, v in self.options:
            check_value(k, "--opt", line=True, empty=False)
            check_value(v, OPTION_FLAGS.get(k, f"--opt {k}"), line=True)
        for line in self.setup:
            check_value(line, "setup line", line=True)
        if self.max_timeout_requeues < 0:
            raise SpecError(f"--max-requeues={self.max_timeout_requeues} must not be negative")
        if self.spares < 0:
            raise SpecError(f"--spares={self.spares} must not be negative", "give the number of spare nodes, e.g. --spares 1")
        if self.max_restarts < 0:
            raise SpecError(f"--max-restarts={self.max_restarts} must not be negative", "0 means: never restart")
        if self.min_nodes is not None and not 1 <= self.min_nodes <= self.nodes:
            raise SpecError(f"--min-nodes={self.min_nodes} must be between 1 and --nodes ({self.nodes})",
                            f"give the fewest nodes the job may go on with, e.g. --min-nodes {max(1, self.nodes - 1)}")
        if self.shrinks and not self.max_restarts:
            raise SpecError(f"--min-nodes={self.min_nodes}: going on with fewer nodes is a restart, and none is allowed",
                            "add --max-restarts R (each shrink is one restart)")
        if self.on_restart_append:
            import shlex

            try:
                shlex.split(self.on_restart_append)
            except ValueError as e:
                raise SpecError(f"--on-restart-append={self.on_restart_append!r} cannot be split into words: {e}",
                                "quote it as for a shell, e.g. '--resume_from_checkpoint {latest:ckpt/*}'") from None
        if self.max_no_progress < 0:
            raise SpecError(f"--max-no-progress={self.max_no_progress} must not be negative", "0 means: never stop for it")
        if self.hang_timeout is not None:
            parse_timeout(self.hang_timeout, "--hang-timeout")  # the grammar's one message for a value under its floor
        if self.signal_before is not None and self.signal_before < 0:
            raise SpecError(f"--signal-before={self.signal_before} must not be negative",
                            "give how long before the time limit the ranks are asked to stop, e.g. --signal-before 300")
        if self.cpus_per_task is not None and self.cpus_per_task < 1:
            raise SpecError(f"--cpus-per-proc={self.cpus_per_task} must be at least 1", "give 1 or more, or leave it out")
        if self.cpus_per_gpu is not None and self.cpus_per_gpu < 1:
            raise SpecError(f"--cpus-per-gpu={self.cpus_per_gpu} must be at least 1", "give 1 or more, or leave it out")
        if self.ntasks_per_node is not None:
            expected = self.expected_tasks_per_node()
            if self.ntasks_per_node != expected:
                why = (
                    f"{self.launcher}'s one task per node" if self.launcher.per_node else
                    f"{self.launcher}'s one task per process ({self.nproc_per_node} per node)"
                )
                raise SpecError(
                    f"--ntasks-per-node={self.ntasks_per_node} does not match {why} "
                    f"(from --launcher {self.launcher})",
                    f"drop --ntasks-per-node (torchhpc sets {expected}) or change --launcher",
                )
        if self.array is not None:
            count = self.array_spec.count  # type: ignore[union-attr]
            for pname, values in self.array_params:
                check_name(pname, "--grid")
                if len(values) != count:
                    raise SpecError(f"--grid {pname} has {len(values)} values for {count} array tasks")
                for value in values:
                    check_value(value, f"--grid {pname}")
            check_placeholders(self.entrypoint.args, ["index", *(n for n, _ in self.array_params)])
        elif self.array_params:
            raise SpecError("sweep parameters without an array", "use torchhpc sweep --grid NAME=V1,V2")
        for dep in self.after:
            if dep.scheduler and dep.scheduler != self.scheduler:
                raise SpecError(
                    f"{dep.flag} {Handle(dep.scheduler, dep.job_id)}: a {dep.scheduler} job cannot be a dependency "
                    f"of a {self.scheduler} job",
                    f"a job waits only for jobs of its own scheduler: give {self.scheduler} job ids",
                )
        # NCCL drives one GPU per rank: more ranks than requested GPUs fail inside every rank's NCCL init.
        too_many = requested_geometry_error(self.nproc_per_node, self.gpus_per_node, dict(self.env))
        if too_many is not None:
            raise SpecError(too_many.message, too_many.hint)

    @property
    def stop_signal_seconds(self) -> Optional[int]:
        """When to ask ranks to stop before the time limit: explicit, else min(300 s, limit / 2)."""
        if self.signal_before == 0:
            return None
        limit = self.time_seconds
        if self.signal_before is not None:
            if limit is not None and self.signal_before >= limit:
                raise SpecError(
                    f"--signal-before={self.signal_before}s is not shorter than --time={self.time}",
                    "give a smaller --signal-before or a longer --time",
                )
            return self.signal_before
        if self.requeue and limit is None:
            return 300
        return None if limit is None else min(300, limit // 2)

    @property
    def array_spec(self) -> Optional[ArraySpec]:
        return None if self.array is None else parse_array(self.array)

    # derived geometry -------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.nodes * self.nproc_per_node

    def expected_tasks_per_node(self) -> int:
        """torchrun starts one task per node that forks the workers; srun/mpirun one per process."""
        return 1 if self.launcher.per_node else self.nproc_per_node

    @property
    def time_seconds(self) -> Optional[int]:
        return parse_walltime(self.time, "--time") if self.time is not None else None

    @property
    def env_dict(self) -> dict[str, str]:
        return dict(self.env)

    @property
    def shrinks(self) -> bool:
        """Whether a node loss may leave the job on fewer nodes (``--min-nodes`` under ``--nodes``)."""
        return self.min_nodes is not None and self.min_nodes < self.nodes

    @property
    def supervised(self) -> bool:
        """Whether a batch job runs its launch under the in-allocation supervisor (torchhpc.supervisor):
        spare nodes or restarts asked for."""
        return bool(self.spares or self.max_restarts)

    @property
    def options_dict(self) -> dict[str, str]:
        return dict(self.options)

    def option(self, key: str, default: str | None = None) -> str | None:
        return self.options_dict.get(key, default)

    def with_(self, **changes: object) -> JobSpec:
        return replace(self, **changes)  # type: ignore[arg-type]


def env_pairs(items: Sequence[str] | Mapping[str, str], source: str = "--env") -> tuple[tuple[str, str], ...]:
    """``["A=1", "B=x=y"]`` -> ``(("A","1"),("B","x=y"))`` with a clear error for ``A``."""
    if isinstance(items, Mapping):
        return tuple((str(k), str(v)) for k, v in items.items())
    out = []
    for item in items:
        if "=" not in item:
            raise SpecError(f"{source} {item!r} is not NAME=VALUE",
                            f"write {source} {item}=VALUE (to pass this shell's value: {source} {item}=\"${item}\")")
        k, v = item.split("=", 1)
        out.append((k, v))
    return tuple(out)


def default_python(spec: JobSpec, python: str | None = None) -> str:
    """The interpreter ranks run: explicit, else ``python`` in a container, else this one.

    Outside containers we use the submitting interpreter (as submitit does): a
    venv on a shared filesystem is the common case and ``python`` on the
    compute node's PATH is often a different one.
    """
    if python:
        return python
    if spec.entrypoint.python:
        return spec.entrypoint.python
    if spec.container is not None:
        return "python"
    return sys.executable or "python3"
