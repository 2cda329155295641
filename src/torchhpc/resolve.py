"""From the values a user gave (flags or :class:`~torchhpc.job.Job` keywords) to a JobSpec.

One function, :func:`build_spec`, used by ``torchhpc run``/``shell``/``bench
sweep`` and by the Python API, so both apply the same precedence (see
:mod:`torchhpc.config`), the same profile rules and the same refusals:

* a profile's ``require`` is satisfied by the real flag (``--time``,
  ``--account``...), and the HINT names that flag;
* a profile that names a container runtime runs nothing on the host by
  accident: without an image it refuses, unless the profile says
  ``container_optional`` or the user gives ``--no-container``;
* ``-n`` with more than one node is ambiguous (per node or in total?) and
  refused; ``--nproc-per-node`` (per node) and ``--ntasks`` (total) are not.

What the scheduler, the launcher and the profile refuse of the picked values is
asked in :mod:`torchhpc.refusals`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torchhpc.config import (
    Value,
    as_given,
    flight_recorder_value,
    hang_timeout_value,
    load_config,
    pick,
    pick_profile,
)
from torchhpc.core.shell import Raw
from torchhpc.core.spec import ContainerSpec, Entrypoint, JobSpec, env_pairs
from torchhpc.core.units import counted
from torchhpc.errors import UsageError
from torchhpc.refusals import check_masks_per_task, check_option_flags, check_requirements, declared, scheduler_has

__all__ = ["build_spec", "default_name", "resolve_values"]

# The scheduler options that have their own flag (--partition, ...): picked like the scalar values (Job() keywords too).
_OPTION_KEYS = ("partition", "account", "qos", "queue", "image")


def default_name(entry: Entrypoint) -> str:
    """The job's name when none is given: ``pi`` for examples/pi.py, the module or command otherwise."""
    base = os.path.basename(entry.target)
    return (base[:-3] if base.endswith(".py") else base.replace(".", "-")) or "torchhpc"


def _get(values: Mapping[str, Any], key: str) -> Any:
    v = values.get(key)
    return None if v in ("", [], ()) else v


def resolve_values(
    values: Mapping[str, Any], environ: Mapping[str, str] | None = None
) -> tuple[Any, dict[str, Value]]:
    """The profile (or None) and the scalar values that have a source, for ``config show``."""
    env = os.environ if environ is None else environ
    config = load_config(env)
    prof_v = pick_profile(values.get("profile"), env, config)  # "" is an answer here: no profile
    profile = None
    if prof_v.value:
        from torchhpc.profiles import get_profile

        with as_given(prof_v, "--profile"):
            profile = get_profile(str(prof_v.value), env)
    out = {"profile": prof_v}

    def p(key: str, flag: str, default: Any = None, cast: Any = None) -> Value:
        v = pick(key, _get(values, key), flag=flag, environ=env, profile=profile, config=config,
                 default=default, cast=cast)
        out[key] = v
        return v

    sched_v = p("scheduler", "--scheduler", "local")
    scheduler = sched_v.value
    from torchhpc.schedulers import scheduler_class

    with as_given(sched_v, "--scheduler"):
        scheduler_class(str(scheduler))  # a name that is no scheduler, named where it came from
    p("launcher", "--launcher", declared(str(scheduler), "default_launcher", "torchrun"))
    p("gpus_per_node", "--gpus-per-node", 0, int)
    p("gpu_kind", "--gpu-kind", "nvidia")
    p("cpus_per_gpu", "--cpus-per-gpu", None, int)
    p("mem", "--mem")
    p("time", "--time")
    p("network", "--network")
    p("spares", "--spares", 0, int)
    p("min_nodes", "--min-nodes", None, int)
    p("max_restarts", "--max-restarts", 0, int)
    p("hang_timeout", "--hang-timeout", None, hang_timeout_value)
    p("max_no_progress", "--max-no-progress", 3, int)
    p("checkpoint_dir", "--checkpoint-dir")
    p("flight_recorder", "--flight-recorder", None, flight_recorder_value)
    for key in _OPTION_KEYS:
        p(key, f"--{key}")
    _defaults_where_honoured(str(scheduler), out)
    return profile, out


def _defaults_where_honoured(scheduler: str, out: dict[str, Value]) -> None:
    """A default (profile, config file) the scheduler cannot honour is not applied, and says so.

    ``time = "01:00:00"`` in config.toml is meant for the batch schedulers: it must not make every
    local run fail. Given on the command line or as ``$TORCHHPC_TIME``, the same value is a request,
    and the capability check refuses it (docs/capabilities.md).
    """
    for key in ("time", "mem", *_OPTION_KEYS):
        v = out.get(key)
        if v is None or v.value in (None, "") or not v.source.startswith(("profile", "config file")):
            continue
        if not scheduler_has(scheduler, key):  # an unknown scheduler has everything: get_scheduler names it later
            out[key] = Value(None, f"not applied: the {scheduler} scheduler has none ({key} {v.value} from {v.source})")


def build_spec(
    values: Mapping[str, Any],
    program: Sequence[str],
    environ: Mapping[str, str] | None = None,
    *,
    preview: Callable[[UsageError], None] | None = None,
) -> JobSpec:
    """A validated JobSpec from user values (argparse dests; absent or None = not given).

    ``preview`` (the dry run) receives the refusals that only matter at
    submission (a profile's container without an image) instead of raising
    them, so the render can still be shown.
    """
    env = os.environ if environ is None else environ
    profile, v = resolve_values(values, env)
    scheduler = v["scheduler"].value
    gpus = int(v["gpus_per_node"].value or 0)
    nodes, nproc = _geometry(values, env, gpus)
    entry = Entrypoint.parse(list(program), module=values.get("module"), python=values.get("python"))
    options = _options(values, v, profile, env)
    job_env = _job_env(values, v, profile)
    container, setup = _container_and_setup(values, profile, scheduler, options, env, entry, preview)
    return JobSpec(
        entrypoint=entry, nodes=nodes, nproc_per_node=nproc, gpus_per_node=gpus, gpu_kind=v["gpu_kind"].value,
        cpus_per_task=values.get("cpus_per_task"), cpus_per_gpu=v["cpus_per_gpu"].value, mem=v["mem"].value,
        time=v["time"].value, name=values.get("name") or default_name(entry),
        output_dir=pick("output_dir", values.get("output_dir"), flag="--output-dir", environ=env, default=".").value,
        env=job_env, launcher=v["launcher"].value, container=container, scheduler=scheduler,
        options=tuple(options.items()), ntasks_per_node=values.get("ntasks_per_node"), network=v["network"].value,
        setup=setup, signal_before=values.get("signal_before"), requeue=bool(values.get("requeue")),
        max_timeout_requeues=int(values["max_requeues"]) if values.get("max_requeues") is not None else 3,
        array=values.get("array"), spares=int(v["spares"].value or 0),
        min_nodes=None if v["min_nodes"].value is None else int(v["min_nodes"].value), max_restarts=int(v["max_restarts"].value or 0),
        hang_timeout=float(v["hang_timeout"].value or 0) or None,  # None and 0 (off): no watch
        max_no_progress=int(3 if v["max_no_progress"].value is None else v["max_no_progress"].value),
        checkpoint_dir=None if v["checkpoint_dir"].value is None else str(v["checkpoint_dir"].value),
        on_restart_append=str(values.get("on_restart_append") or ""), after=dependencies(values, str(scheduler)),
    )


def _geometry(values: Mapping[str, Any], env: Mapping[str, str], gpus: int) -> tuple[int, int]:
    """(nodes, processes per node), the latter from exactly one unambiguous source: ``-n``,
    ``--nproc-per-node``, ``--ntasks`` divided over the nodes, else one per GPU (or one).
    ``--nodes`` below one is JobSpec's to refuse; nothing is divided by it here."""
    nodes = pick("nodes", _get(values, "nodes"), flag="--nodes", environ=env, default=1, cast=int).value
    short, long_, total = values.get("nproc_short"), values.get("nproc_per_node"), values.get("ntasks")
    if short is not None and long_ is not None and short != long_:
        raise UsageError(f"-n {short} and --nproc-per-node {long_} disagree", "give one of them")
    if short is not None and nodes > 1:
        raise UsageError(
            f"-n {short} with --nodes {nodes} is ambiguous: {short} per node ({short * nodes} ranks) or {short} in total?",
            f"say --nproc-per-node {short} for {short} per node, or --ntasks {short} for {short} in total "
            f"(divided evenly over the {nodes} nodes)",
        )
    per_node = long_ if long_ is not None else short
    if total is not None and total < 1:
        raise UsageError(f"--ntasks {total} must be at least 1", "give the number of processes in total, e.g. --ntasks 4")
    if total is not None and nodes >= 1:
        if total % nodes:
            raise UsageError(
                f"--ntasks {total} cannot be divided evenly over --nodes {nodes}",
                f"give a multiple of {nodes}, or --nproc-per-node N for N per node",
            )
        if per_node is not None and per_node * nodes != total:
            raise UsageError(f"--ntasks {total} and {per_node} per node on {counted(nodes, 'node')} disagree", "give one of them")
        per_node = total // nodes
    return nodes, pick("nproc_per_node", per_node, flag="--nproc-per-node", environ=env, default=gpus or 1, cast=int).value


def _options(values: Mapping[str, Any], v: Mapping[str, Value], profile: Any, env: Mapping[str, str]) -> dict[str, str]:
    """The scheduler options: flags and ``$TORCHHPC_*``, then the profile's defaults, then ``--opt K=V``;
    checked against the scheduler (an option it lacks), the launcher (CPU masks) and the profile's
    requirements."""
    scheduler = v["scheduler"].value
    options: dict[str, str] = {k: str(v[k].value) for k in _OPTION_KEYS if v[k].value}
    asked = dict(options)  # from flags or $TORCHHPC_*: config-file defaults were cleared where not honoured
    if profile is not None:
        for k, val in profile.options:
            options.setdefault(str(k), str(val))
        if profile.cpu_bind:
            options.setdefault("cpu_bind", str(profile.cpu_bind))
    opt = values.get("opt") or ()
    for item in opt.items() if isinstance(opt, Mapping) else opt:
        if isinstance(item, tuple):
            k, val = item
        elif "=" not in item:
            raise UsageError(f"--opt {item!r} is not KEY=VALUE", "e.g. --opt constraint=a100")
        else:
            k, val = item.split("=", 1)
        options[str(k)] = str(val)
        asked[str(k)] = str(val)
    check_option_flags(str(scheduler), options, asked)
    check_masks_per_task(options.get("cpu_bind", ""), str(v["launcher"].value), profile)
    if profile is not None:
        given = {**options, "time": v["time"].value, "mem": v["mem"].value}
        if values.get("interactive_shell"):  # torchhpc shell: what the site's salloc may leave out
            given.update({req: "(not needed by a shell)" for req in profile.shell_optional})
        check_requirements(profile, scheduler, given, env)
    if declared(scheduler, "runs_in_pods", False) and values.get("bind") and not values.get("container"):
        # Pods take --image, not --container: --bind CLAIM:/path (a PVC) still reaches the scheduler, never dropped.
        options.setdefault("bind", ",".join(values["bind"]))
    return options


def _job_env(values: Mapping[str, Any], v: Mapping[str, Value], profile: Any) -> tuple[tuple[str, str], ...]:
    """The job's environment: the profile's, the network preset's where no script applies it, the
    Flight Recorder switch, then the user's ``--env`` (which wins)."""
    job_env = dict(profile.env) if profile is not None else {}
    network, scheduler = v["network"].value, v["scheduler"].value
    # Batch scripts apply presets themselves with setdefault semantics (network.presets.script_lines), so a
    # variable exported at submit time still wins; the other schedulers get them as job environment here.
    if network and not declared(scheduler, "renders_script", False):
        from torchhpc.network.presets import preset_env

        for k, val in preset_env(network).items():
            job_env.setdefault(k, val)
    if v["flight_recorder"].value is not None:  # the rank boot reads it (boot/sitecustomize.py)
        job_env["TORCHHPC_FLIGHT_RECORDER"] = flight_recorder_value(v["flight_recorder"].value)
    job_env.update(env_pairs(values.get("env") or ()))
    return tuple(job_env.items())


def _container_and_setup(
    values: Mapping[str, Any], profile: Any, scheduler: str, options: dict[str, str], env: Mapping[str, str],
    entry: Entrypoint, preview: Callable[[UsageError], None] | None,
) -> tuple[Any, tuple[str, ...]]:
    """The container (or None) and the profile's setup lines (its container setup too, in a container).
    A dry run shows a profile's image without an image, and notes one that lacks torchhpc."""
    try:
        container = _container(values, profile, scheduler, options, env)
    except _NoImage as e:
        if preview is None:
            raise
        preview(e)
        container = None
    own_image = not values.get("container") and not env.get("TORCHHPC_CONTAINER")  # the profile's default image
    if preview is not None and container is not None and profile is not None and profile.image_without_torchhpc and own_image:
        notice = _imports_torchhpc(entry, str(profile.container_image), profile.name)
        if notice is not None:
            preview(notice)
    if profile is None:
        return container, ()
    return container, tuple(profile.setup) + (tuple(profile.container_setup) if container is not None else ())


def dependencies(values: Mapping[str, Any], scheduler: str) -> tuple[Any, ...]:
    """``--after-ok``/``--after``, ``--after-any``, ``--after-fail`` (or ``Job(after=..., after_any=...,
    after_fail=...)``: ids, handles, lists of them) as the spec's dependencies (core/depend.py)."""
    from torchhpc.core.depend import parse_dependencies
    from torchhpc.schedulers import REGISTRY

    ok = [*(values.get("after_ok") or ()), *_as_list(values.get("after"))]
    return (*parse_dependencies("ok", ok, scheduler, REGISTRY),
            *parse_dependencies("any", values.get("after_any"), scheduler, REGISTRY),
            *parse_dependencies("fail", values.get("after_fail"), scheduler, REGISTRY))


def _as_list(value: Any) -> list[Any]:
    if value is None or value == "":
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


class Notice(UsageError):
    """A dry-run warning about something that may still work (not a refusal)."""


def _imports_torchhpc(entry: Entrypoint, image: str, profile: str) -> Notice | None:
    """The program imports torchhpc unconditionally (a top-level import, not one in a try/except
    fallback as examples/pi.py has) while the profile's image does not carry it: the ranks would
    stop at ``import torchhpc`` (LUMI's PyTorch container, the LUMI guide)."""
    script = entry.target if entry.kind == "script" else None
    if not script or not os.path.isfile(script):
        return None
    try:
        with open(script, encoding="utf-8", errors="replace") as f:
            text = f.read(200_000)
    except OSError:
        return None
    if not re.search(r"^(import torchhpc|from torchhpc[. ])", text, re.M):
        return None
    return Notice(
        f"{script} imports torchhpc, which the image of profile {profile!r} ({image}) does not carry",
        "install it into the image's Python (e.g. a venv on top of the container: pip install torchhpc), "
        "or bind a torchhpc checkout and add it to PYTHONPATH with --env",
    )


class _NoImage(UsageError):
    """A profile's container runtime without an image: refused when submitting, a warning in a dry run."""


def _container(
    values: Mapping[str, Any], profile: Any, scheduler: str, options: Mapping[str, str], env: Mapping[str, str]
) -> ContainerSpec | None:
    if values.get("no_container"):
        if values.get("container"):
            raise UsageError("--container and --no-container contradict each other", "give one of them")
        return None
    if values.get("container") == "" or (values.get("container") is None and env.get("TORCHHPC_CONTAINER") == ""):
        raise UsageError("--container is empty", "give an image (a .sif file, docker://... or a name), or drop --container")
    image = values.get("container") or env.get("TORCHHPC_CONTAINER") or None
    runtime = values.get("runtime") or env.get("TORCHHPC_RUNTIME") or (
        profile.container_runtime if profile is not None else None
    )
    pod_scheduler = bool(declared(scheduler, "runs_in_pods", False))
    if not image and profile is not None and options.get("image") is None:
        image = profile.container_image
    if not image:
        if pod_scheduler:
            return None  # pods take --image; the runtime is the cluster's
        if values.get("runtime"):
            raise UsageError(f"--runtime {values['runtime']} needs an image", "add --container IMAGE")
        if runtime and profile is not None and not profile.container_optional:
            raise _NoImage(
                f"profile {profile.name!r} runs every rank in {runtime}, but no image was given",
                "add --container IMAGE (a .sif file, docker://... or an image name), "
                "or --no-container to run on the host's python",
            )
        return None
    if re.fullmatch(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?", image):
        # A site variable such as LUMI's $SIF (set by its container module): expand it in the job.
        image = Raw(f'"{image}"')
    opts = tuple(profile.container_options) if profile is not None else ()
    return ContainerSpec(
        image=image,
        runtime=runtime or "apptainer",
        binds=tuple(values.get("bind") or ()),
        env=tuple(values.get("container_env") or ()),
        cleanenv=bool(values.get("cleanenv")),
        options=opts,
    )
