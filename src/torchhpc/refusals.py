"""What the scheduler, the launcher and the profile refuse of the values :mod:`torchhpc.resolve` picked.

Apart from resolve.py, which picks each value from its sources (flags, ``$TORCHHPC_*``, the profile, the
config file): here each value is held against what will run it, asked of the class that knows
(a scheduler's ``OPTIONS`` and ``supports_*``, a launcher's ``per_node``), never by comparing names.
:func:`scheduler_has` is the one rule for what a scheduler has: a default it lacks is not applied
(resolve.py), a requirement it lacks is not asked (:func:`check_requirements`), an option it lacks
that the user typed is refused (:func:`check_option_flags`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torchhpc.errors import SpecError, UsageError

__all__ = ["FLAGS", "check_masks_per_task", "check_option_flags", "check_requirements", "declared", "scheduler_has"]

# How each required key is given on the command line (for HINTs).
FLAGS: dict[str, str] = {
    "account": "--account ACCOUNT (-A)",
    "qos": "--qos QOS",
    "time": "--time HH:MM:SS",
    "partition": "--partition NAME",
    "queue": "--queue NAME",
    "image": "--image IMAGE",
    "mem": "--mem SIZE",
}


def declared(scheduler: str, attribute: str, default: Any) -> Any:
    """What the scheduler's class declares (``default_launcher``, ``runs_in_pods``, ``env_options``...),
    asked instead of comparing names; ``default`` for a name that is no scheduler (named later)."""
    from torchhpc.schedulers import REGISTRY, scheduler_class

    return getattr(scheduler_class(scheduler), attribute) if scheduler in REGISTRY else default


def scheduler_has(scheduler: str, key: str) -> bool:
    """Whether ``scheduler`` has ``key``: a time limit, memory, or a declared option. The one rule for a
    default it cannot honour (not applied) and for a profile's requirement (not asked)."""
    from torchhpc.schedulers import REGISTRY, scheduler_class

    if scheduler not in REGISTRY:
        return True
    cls = scheduler_class(scheduler)
    if key == "time":
        return bool(cls.supports_time_limit)
    if key == "mem":
        return bool(cls.supports_memory)
    return key in cls.OPTIONS


def check_option_flags(scheduler: str, options: dict[str, str], given: Mapping[str, str]) -> None:
    """A scheduler option the user asked for (``--partition``, ``--queue``, ``--exclude``, ``--opt K=V``)
    that the scheduler does not have is refused, naming the flag as typed; never dropped in silence.
    Defaults from a profile or the config file that the scheduler lacks were already set aside
    (``config show``: "not applied")."""
    from torchhpc.core.spec import OPTION_FLAGS

    offered = declared(scheduler, "OPTIONS", None)
    if offered is None:  # no such scheduler: named later
        return
    for key in [k for k in options if k not in offered]:
        if key not in given:
            continue  # a profile's own option: its backend reads what it knows (as before)
        flag = OPTION_FLAGS.get(key, f"--opt {key}=")
        typed = f"{flag}{options[key]}" if flag.endswith("=") else f"{flag} {options[key]}"
        if key == "queue" and "partition" in offered:  # Slurm
            hint = f"the {scheduler} scheduler calls its queues partitions: --partition {options[key]}"
        elif key in ("partition", "account", "qos", "queue", "exclude"):
            hint = f"drop {flag.rstrip('=')}, or submit to a batch scheduler (--scheduler slurm or pbs)"
        else:
            hint = f"valid: {', '.join(offered) or 'none'}; `torchhpc options {scheduler}` describes them"
        what = {"partition": "partitions", "account": "accounts", "qos": "QOS", "queue": "queues",
                "exclude": "nodes to exclude (one machine)"}.get(key, f"option {key!r}")
        raise SpecError(f"{typed}: the {scheduler} scheduler has no {what}", hint)


def check_masks_per_task(cpu_bind: str, launcher: str, profile: Any) -> None:
    """A mask list binds one task per GPU: torchrun's one task per node would squeeze all its workers
    into the first mask (LUMI: 8 workers on 7 cores), so it is refused, naming the launchers that fit."""
    from torchhpc.launchers import get_launcher

    if not cpu_bind.startswith("mask_cpu:") or "," not in cpu_bind or not get_launcher(launcher).per_node:
        return
    where = f"profile {profile.name!r}" if profile is not None and profile.cpu_bind else "--opt cpu_bind"
    raise UsageError(
        f"--launcher {launcher} with the CPU masks of {where} (one per task, one task per GPU): "
        "torchrun's single task per node cannot give each worker its own mask",
        "use --launcher srun (the seed's way: one task per GPU, each with its mask and its GPU), or mpirun",
    )


def check_requirements(profile: Any, scheduler: str, given: Mapping[str, Any], env: Mapping[str, str]) -> None:
    """The profile's required values that are missing, all in one error; only those the scheduler has
    (an mn5 profile's account, qos and time mean nothing to a local run)."""
    missing = []
    for req in profile.require:
        if given.get(req) or not scheduler_has(scheduler, req):
            continue
        var = declared(scheduler, "env_options", {}).get(req)
        if var and env.get(var):
            continue  # the submit command reads it itself (sbatch: $SBATCH_ACCOUNT, as the LUMI guide does)
        missing.append(req)
    if not missing:
        return
    flags = [FLAGS.get(req, f"--opt {req}=VALUE") for req in missing]
    also = ""
    if any(req in ("account", "partition", "qos", "queue", "time") for req in missing):
        also = " (or set them once in ~/.config/torchhpc/config.toml, or as $TORCHHPC_<NAME>)"
    names = ", ".join(f.split()[0] for f in flags)
    raise UsageError(
        f"profile {profile.name!r} requires {names}: the site rejects jobs without {'them' if len(missing) > 1 else 'it'}",
        f"add {' '.join(flags)}{also}; --profile none runs without the profile",
    )
