"""What each scheduler can honour, and the one check that refuses or converts the rest.

A backend declares its capabilities as class attributes of its scheduler class
(``supports_time_limit = True``...; the defaults are on
:class:`~torchhpc.schedulers.api.Scheduler`). Nothing else compares scheduler
names to decide what a job may ask for: :func:`check` reads those attributes,
and every render goes through it (``Scheduler.render`` is a template method: the
check, then the backend's ``_render`` hook), so the CLI, the Python API, sweeps and benchmarks apply
the same rule. A request the scheduler cannot honour is never dropped: it is
either refused with a HINT or turned into what it means there, with a note
that the dry run prints. docs/capabilities.md is the table, written from
:data:`RULES` (a test keeps them equal).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Optional, Protocol

from torchhpc.core.spec import JobSpec
from torchhpc.core.units import counted
from torchhpc.errors import SpecError

__all__ = ["CAPABILITIES", "RULES", "Capable", "Rule", "check", "markdown"]


class Capable(Protocol):
    """What :func:`check` reads: a scheduler class or instance (its name; its ``supports_*`` by getattr).

    A protocol, not the ``Scheduler`` class: the contract (api) imports this module, not the reverse.
    """

    @property
    def name(self) -> str: ...

# attribute -> what it means (the rows of docs/capabilities.md's first table)
CAPABILITIES: dict[str, str] = {
    "supports_multi_node": "more than one node (--nodes N)",
    "supports_time_limit": "a wall-time limit (--time) and the stop signal before it (--signal-before)",
    "supports_requeue": "requeue after the stop signal (--requeue, --max-requeues)",
    "supports_arrays": "job arrays (--array, torchhpc sweep)",
    "supports_gpus": "GPUs per node (--gpus-per-node)",
    "supports_memory": "memory per node (--mem)",
    "supports_cpus": "CPUs reserved per process (--cpus-per-proc)",
    "supports_cpus_per_gpu": "CPUs per GPU (--cpus-per-gpu, or a profile's cpus_per_gpu)",
    "supports_container_options": "host container options (--bind, --container-env, --cleanenv)",
    "supports_setup": "a profile's setup lines (module load ...) before the ranks start",
    "supports_interactive_shell": "an interactive allocation (torchhpc shell)",
    "supports_dependencies": "start after other jobs (--after-ok, --after-any, --after-fail; torchhpc pipeline)",
    "supports_rank_probe": "a probe on every node of a running job (torchhpc top, the stacks of --hang-timeout)",
    "supports_spares": "spare nodes in the allocation and the in-allocation supervisor (--spares)",
    "supports_shrink": "after a node loss, the next attempt on the nodes that are left (--min-nodes)",
    "supports_restarts": "restarts after a node failure, hang or network error (--max-restarts)",
}


@dataclass(frozen=True)
class Rule:
    """One flag: when a spec uses it, the capability it needs, and what happens without it."""

    flag: str
    capability: str
    used: Callable[[JobSpec], bool]
    refuse: Optional[Callable[[str, JobSpec], tuple[str, str]]] = None  # (message, HINT)
    convert: Optional[Callable[[str, JobSpec], tuple[JobSpec, str]]] = None  # (new spec, dry-run note)
    otherwise: str = "refused"  # the docs' words for what happens without the capability


def _cpus_to_threads(name: str, spec: JobSpec) -> tuple[JobSpec, str]:
    n = spec.cpus_per_task
    env = dict(spec.env)
    if "OMP_NUM_THREADS" in env:
        return spec.with_(cpus_per_task=None), (
            f"--cpus-per-proc {n}: the {name} scheduler reserves no CPUs; OMP_NUM_THREADS={env['OMP_NUM_THREADS']} "
            "from --env stays"
        )
    env["OMP_NUM_THREADS"] = str(n)
    return spec.with_(cpus_per_task=None, env=tuple(env.items())), (
        f"--cpus-per-proc {n}: the {name} scheduler reserves no CPUs; each rank gets OMP_NUM_THREADS={n} instead"
    )


def _cpus_per_gpu_to_cpus(name: str, spec: JobSpec) -> tuple[JobSpec, str]:
    per_gpu = spec.cpus_per_gpu or 0
    per_proc = per_gpu * max(1, spec.gpus_per_node // spec.nproc_per_node)
    return spec.with_(cpus_per_gpu=None, cpus_per_task=per_proc), (
        f"--cpus-per-gpu {per_gpu}: the {name} scheduler takes CPUs per process: "
        f"--cpus-per-proc {per_proc} ({counted(spec.gpus_per_node, 'GPU')} over {counted(spec.nproc_per_node, 'process', 'processes')})"
    )


# Why --min-nodes is refused, per scheduler.
SHRINK_WHY = {
    "pbs": "PBS gives the supervisor no per-node liveness check or step placement on a subset of the nodes "
           "(the same reason as --spares)",
    "kubernetes": "a TrainJob has no elastic fields, and a PyTorchJob's elasticPolicy restarts every pod through "
                  "torchrun --nnodes MIN:MAX, not the job on the nodes that are left",
    "runai": "RunAI's distributed jobs have a fixed worker count",
}

# Why --spares is refused, per scheduler: the docs' and the error's words.
SPARES_WHY = {
    "local": "the local scheduler runs on this machine only, there is no other node to move to",
    "pbs": "the PBS body launches through pbsdsh/mpirun over $PBS_NODEFILE, and PBS gives the supervisor no "
           "per-node liveness check or step placement it can trust (no slurmd to probe, no srun --nodelist)",
    "kubernetes": "pods are rescheduled by the cluster onto healthy nodes; a spare pod would only idle",
    "runai": "RunAI schedules pods on healthy nodes itself; a spare pod would only idle",
}

RULES: tuple[Rule, ...] = (
    Rule(
        "--nodes", "supports_multi_node", lambda s: s.nodes > 1,
        refuse=lambda n, s: (
            f"--nodes={s.nodes}: the {n} scheduler runs on this machine only (nodes=1)",
            "drop --nodes and use -n/--nproc-per-node for more ranks, or pick --scheduler slurm",
        ),
    ),
    Rule(
        "--time", "supports_time_limit", lambda s: s.time is not None,
        refuse=lambda n, s: (
            f"--time {s.time}: the {n} scheduler has no wall-time limit",
            "drop --time (wrap the command in `timeout` to bound it), or pick --scheduler slurm, pbs or kubernetes",
        ),
    ),
    Rule(
        "--signal-before", "supports_time_limit", lambda s: bool(s.signal_before),
        refuse=lambda n, s: (
            f"--signal-before {s.signal_before}: the {n} scheduler has no time limit to signal before",
            "drop --signal-before, or pick --scheduler slurm or pbs",
        ),
    ),
    Rule(
        "--requeue", "supports_requeue", lambda s: s.requeue,
        refuse=lambda n, s: (
            f"--requeue: the {n} scheduler cannot requeue a job",
            "drop --requeue (the ranks still get the stop signal where there is a time limit), "
            "or pick --scheduler slurm or pbs",
        ),
    ),
    Rule(
        "--array", "supports_arrays", lambda s: s.array is not None,
        refuse=lambda n, s: (
            f"--array {s.array}: the {n} scheduler has no job arrays",
            "submit one job per task (torchhpc run with -e TORCHHPC_ARRAY_INDEX=I in a loop), "
            "or pick --scheduler slurm, pbs or local",
        ),
    ),
    Rule(
        "--gpus-per-node", "supports_gpus", lambda s: s.gpus_per_node > 0,
        refuse=lambda n, s: (
            f"--gpus-per-node {s.gpus_per_node}: the {n} scheduler cannot give a job GPUs",
            "drop --gpus-per-node, or pick a scheduler with GPUs",
        ),
    ),
    Rule(
        "--mem", "supports_memory", lambda s: s.mem is not None,
        refuse=lambda n, s: (
            f"--mem {s.mem}: the {n} scheduler cannot reserve or limit memory",
            "drop --mem, or pick --scheduler slurm, pbs, kubernetes or runai",
        ),
    ),
    # Before --cpus-per-proc: a converted --cpus-per-gpu becomes a --cpus-per-proc, which the next rule sees.
    Rule(
        "--cpus-per-gpu", "supports_cpus_per_gpu",
        lambda s: bool(s.cpus_per_gpu) and s.gpus_per_node > 0 and s.cpus_per_task is None,
        convert=_cpus_per_gpu_to_cpus,
        otherwise="converted to --cpus-per-proc (CPUs per GPU x GPUs per process), unless --cpus-per-proc is given",
    ),
    Rule(
        "--cpus-per-proc", "supports_cpus", lambda s: s.cpus_per_task is not None,
        convert=_cpus_to_threads,
        otherwise="converted to OMP_NUM_THREADS=N for each rank (unless --env sets it)",
    ),
    Rule(
        "--bind, --container-env, --cleanenv", "supports_container_options",
        lambda s: s.container is not None and bool(s.container.binds or s.container.env or s.container.cleanenv),
        refuse=lambda n, s: (
            f"--bind/--container-env/--cleanenv: the {n} scheduler runs pods, whose runtime is the cluster's",
            "mount volumes with --opt pvc=CLAIM:/path, pass variables with --env, and drop --cleanenv",
        ),
    ),
    Rule(
        "--spares", "supports_spares", lambda s: s.spares > 0,
        refuse=lambda n, s: (
            f"--spares {s.spares}: {SPARES_WHY.get(n, f'the {n} scheduler has no allocation to keep spare nodes in')}",
            "drop --spares (--max-restarts still restarts where the scheduler can), or pick --scheduler slurm",
        ),
        otherwise="refused, with the reason (docs/resilience.md)",
    ),
    Rule(
        "--min-nodes", "supports_shrink", lambda s: s.shrinks,
        refuse=lambda n, s: (
            f"--min-nodes {s.min_nodes}: {SHRINK_WHY.get(n, f'the {n} scheduler cannot run a job on fewer nodes')}",
            "drop --min-nodes (the job then ends or requeues after a node loss), or pick --scheduler slurm",
        ),
        otherwise="refused, with the reason (docs/resilience.md)",
    ),
    Rule(
        "--max-restarts", "supports_restarts", lambda s: s.max_restarts > 0,
        refuse=lambda n, s: (
            f"--max-restarts {s.max_restarts}: the {n} scheduler has no restart this job could use",
            "drop --max-restarts, or pick --scheduler slurm (in the allocation) or kubernetes --opt api=pytorchjob",
        ),
    ),
    Rule(
        "--after-ok, --after-any, --after-fail", "supports_dependencies", lambda s: bool(s.after),
        refuse=lambda n, s: (
            f"{s.after[0].flag} {s.after[0].job_id}: the {n} scheduler cannot hold a job until another ends",
            "submit it once the other job has ended (torchhpc wait HANDLE && torchhpc run ...), "
            "or pick --scheduler slurm, pbs or local",
        ),
    ),
    Rule(
        "profile setup lines", "supports_setup", lambda s: bool(s.setup),
        refuse=lambda n, s: (
            f"the profile's setup lines ({s.setup[0]!r}...) cannot run before the ranks under the {n} scheduler",
            "build them into the image, or use a profile without setup lines",
        ),
    ),
)


def check(scheduler: Capable, spec: JobSpec) -> tuple[JobSpec, tuple[str, ...]]:
    """``spec`` as ``scheduler`` can run it, and a note per conversion; a refusal raises :class:`SpecError`.

    Pure and idempotent: a converted spec passes again unchanged, with no notes.
    """
    name = scheduler.name
    notes: list[str] = []
    for rule in RULES:
        if getattr(scheduler, rule.capability) or not rule.used(spec):
            continue
        if rule.convert is not None:
            spec, note = rule.convert(name, spec)
            notes.append(note)
            continue
        assert rule.refuse is not None
        message, hint = rule.refuse(name, spec)
        raise SpecError(message, hint)
    return spec, tuple(notes)



def markdown(classes: Mapping[str, object]) -> str:
    """docs/capabilities.md's two tables, from the classes' attributes and :data:`RULES` (a test compares them).

    Args:
        classes: scheduler name -> its class, in the table's column order (the registry's).

    Returns:
        The Markdown text of both tables.
    """
    lines = ["| capability | " + " | ".join(classes) + " |", "|---|" + "---|" * len(classes)]
    for attr, meaning in CAPABILITIES.items():
        cells = ["yes" if getattr(c, attr) else "**no**" for c in classes.values()]
        lines.append(f"| `{attr}`: {meaning} | " + " | ".join(cells) + " |")
    lines += ["", "| flag | needs | without it |", "|---|---|---|"]
    lines += [f"| `{rule.flag}` | `{rule.capability}` | {rule.otherwise} |" for rule in RULES]
    return "\n".join(lines) + "\n"
