"""The :class:`Profile` dataclass: one site's defaults, typed, every field optional."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, Optional

from torchhpc.core.shell import join
from torchhpc.errors import ConfigError, UsageError

__all__ = ["FIELD_DOCS", "Profile"]

# One line per field: shown by `torchhpc profiles show`, in ConfigError hints and in docs.
FIELD_DOCS: dict[str, str] = {
    "name": "the profile's name (set from the TOML table name)",
    "description": "one line about the site",
    "extends": "built-in or user profile this one starts from",
    "scheduler": "local, slurm, pbs, kubernetes or runai",
    "launcher": "torchrun, srun or mpirun",
    "partition": "Slurm partition (--partition)",
    "account": "account/project to charge (--account, PBS -A)",
    "qos": "Slurm quality of service (--qos)",
    "queue": "PBS queue (-q)",
    "gpus_per_node": "GPUs (or AMD GCDs) per node",
    "cpus_per_gpu": "CPU cores per GPU",
    "mem": "memory per node, e.g. 480G",
    "time": "default wall time, e.g. 01:00:00",
    "modules": "environment modules to load, in order",
    "container_runtime": "apptainer, singularity, pyxis, enroot, docker, podman or charliecloud",
    "container_image": "default image; may name a variable the modules set, e.g. $SIF",
    "container_setup": "shell lines run before the container starts",
    "container_options": "runtime options (as in `torchhpc options`), e.g. gpu = \"none\" for a container that brings its own ROCm",
    "container_optional": "true: without an image, ranks run on the host (otherwise a profile naming a runtime refuses)",
    "image_without_torchhpc": "true: the profile's default image has no torchhpc; a dry run warns when the program imports it",
    "network": "network preset for --network (see `torchhpc net presets`)",
    "cpu_bind": "srun --cpu-bind value, e.g. mask_cpu:0xfe,...",
    "env": "extra environment variables (NAME = value)",
    "options": "scheduler options (as for --option KEY=VALUE)",
    "setup": "shell lines at the top of the batch script (after module loads)",
    "require": "options the user must give (e.g. account, qos)",
    "shell_optional": "of require, those an interactive `torchhpc shell` may leave out (e.g. time: the QoS has a default)",
    "gpu_kind": "nvidia or amd",
    "spares": "spare nodes allocated beside the job's, used after a node failure (--spares)",
    "min_nodes": "the fewest nodes a job goes on with after a node loss with no spare left (--min-nodes)",
    "max_restarts": "restarts inside the allocation after a node failure, hang or network error (--max-restarts)",
    "hang_timeout": "seconds without output or CPU use after which ranks count as hung (--hang-timeout)",
    "max_no_progress": "attempts in a row without a checkpoint advance before the job ends with no-progress; 0: never (--max-no-progress)",
    "checkpoint_dir": "where the program saves checkpoints; the newest one's step tells the supervisor it advanced (--checkpoint-dir)",
    "flight_recorder": "collectives each rank's Flight Recorder keeps for the hang verdict, or off (--flight-recorder)",
}

_INT = ("gpus_per_node", "cpus_per_gpu", "spares", "min_nodes", "max_restarts", "hang_timeout", "max_no_progress")
_TUPLE = ("modules", "container_setup", "setup", "require", "shell_optional")
_PAIRS = ("env", "options", "container_options")
_BOOL = ("container_optional", "image_without_torchhpc")
_CHOICES = {
    "scheduler": ("local", "slurm", "pbs", "kubernetes", "runai"),
    "launcher": ("torchrun", "srun", "mpirun"),
    "gpu_kind": ("nvidia", "amd"),
    "container_runtime": ("apptainer", "singularity", "pyxis", "enroot", "docker", "podman", "charliecloud"),
}


@dataclass(frozen=True)
class Profile:
    """A site's defaults. ``None``/empty means "no opinion": the job's own value or the built-in default applies.

    Precedence when a job is built: command line > ``TORCHHPC_*`` variable >
    profile > built-in default.
    """

    name: str
    description: str = ""
    extends: Optional[str] = None
    scheduler: Optional[str] = None
    launcher: Optional[str] = None
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    queue: Optional[str] = None
    gpus_per_node: Optional[int] = None
    cpus_per_gpu: Optional[int] = None
    mem: Optional[str] = None
    time: Optional[str] = None
    modules: tuple[str, ...] = ()
    container_runtime: Optional[str] = None
    container_image: Optional[str] = None
    container_setup: tuple[str, ...] = ()
    container_options: tuple[tuple[str, str], ...] = ()
    container_optional: bool = False
    image_without_torchhpc: bool = False
    network: Optional[str] = None
    cpu_bind: Optional[str] = None
    env: tuple[tuple[str, str], ...] = ()
    options: tuple[tuple[str, str], ...] = ()
    setup: tuple[str, ...] = ()
    require: tuple[str, ...] = ()
    shell_optional: tuple[str, ...] = ()
    gpu_kind: Optional[str] = None
    spares: Optional[int] = None
    min_nodes: Optional[int] = None
    max_restarts: Optional[int] = None
    hang_timeout: Optional[int] = None
    max_no_progress: Optional[int] = None
    checkpoint_dir: Optional[str] = None
    flight_recorder: Optional[str] = None
    # [USER@]HOST of the site's login node: --remote's default (docs/remote.md)
    remote: Optional[str] = None

    @classmethod
    def from_mapping(cls, name: str, data: Mapping[str, Any], source: str) -> Profile:
        """Build from a TOML table; unknown keys and ill-typed values raise :class:`ConfigError`."""
        valid = [f.name for f in fields(cls) if f.name != "name"]
        kwargs: dict[str, Any] = {"name": name}
        for key, value in data.items():
            where = f"profile {name!r} in {source}"
            if key not in valid:
                raise ConfigError(
                    f"unknown key {key!r} in {where}",
                    "valid keys: " + ", ".join(valid),
                )
            kwargs[key] = _coerce(key, value, where)
        return cls(**kwargs)

    def merged_onto(self, base: Profile) -> Profile:
        """This profile's set fields over ``base`` (``env``/``options`` merge by name, this one winning)."""
        changes: dict[str, Any] = {"name": self.name, "extends": self.extends}
        for f in fields(self):
            if f.name in ("name", "extends"):
                continue
            mine, theirs = getattr(self, f.name), getattr(base, f.name)
            if f.name in _PAIRS:
                changes[f.name] = tuple({**dict(theirs), **dict(mine)}.items())
            elif mine not in (None, (), "") and mine is not False:
                changes[f.name] = mine
        return replace(base, **changes)

    def setup_lines(self) -> list[str]:
        """``module load`` lines for :attr:`modules`, then :attr:`setup`: the top of a batch script.

        Idempotent: module lines already in ``setup`` (as in a profile from
        :func:`~torchhpc.profiles.get_profile`) are not repeated.
        """
        lines = [ln for ln in (join(["module", "load", m]) for m in self.modules) if ln not in self.setup]
        return [*lines, *self.setup]

    def finalized(self) -> Profile:
        """The profile as jobs use it: ``setup`` starts with the ``module load`` lines."""
        return replace(self, setup=tuple(self.setup_lines()))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if v in (None, (), "") or v is False:
                continue
            out[f.name] = dict(v) if f.name in _PAIRS else list(v) if isinstance(v, tuple) else v
        return out


def _coerce(key: str, value: Any, where: str) -> Any:
    def bad(expected: str) -> ConfigError:
        return ConfigError(f"{key} = {value!r} in {where} is not {expected}", f"{key}: {FIELD_DOCS.get(key, '')}")

    if key in _BOOL:
        if not isinstance(value, bool):
            raise bad("true or false")
        return value
    if key in _INT:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise bad("a non-negative integer")
        return value
    if key in _TUPLE:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise bad("a list of strings")
        return tuple(value)
    if key in _PAIRS:
        if not isinstance(value, dict):
            raise bad('a table (e.g. { NAME = "value" })')
        pairs = []
        for k, v in value.items():
            if key == "env" and not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", str(k)):
                raise ConfigError(f"env name {k!r} in {where} is not a valid variable name", "use letters, digits, _")
            if isinstance(v, bool):
                v = "1" if v else "0"
            if not isinstance(v, (str, int, float)):
                raise bad("a table of strings")
            pairs.append((str(k), str(v)))
        return tuple(pairs)
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise bad("a string")
    text = str(value)
    if key == "network":
        from torchhpc.network.presets import preset_env

        try:
            preset_env(text)
        except UsageError as e:
            raise ConfigError(f"network = {text!r} in {where}: {e.message}", e.hint) from None
    if key in _CHOICES and text not in _CHOICES[key]:
        raise ConfigError(f"{key} = {text!r} in {where} is not valid", f"choose one of: {', '.join(_CHOICES[key])}")
    return text
