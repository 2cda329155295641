"""Per-user defaults: ``~/.config/torchhpc/config.toml``, and where every job value comes from.

The file holds a few top-level keys, each a default for the flag of the same name::

    scheduler = "slurm"
    profile = "mn5"
    account = "bsc98"
    qos = "acc_bsccs"
    time = "00:30:00"

Where it lives: ``$TORCHHPC_CONFIG`` (a path), else
``$XDG_CONFIG_HOME/torchhpc/config.toml`` (default ``~/.config/torchhpc/config.toml``).
A missing file is no error; an unknown key or an ill-typed value is.

Precedence for every job value, first found wins:

1. the command line (or the keyword argument of :class:`torchhpc.job.Job`);
2. the ``TORCHHPC_*`` variable (``TORCHHPC_ACCOUNT``);
3. the profile (``--profile``, else ``TORCHHPC_PROFILE``, else the file's ``profile``):
   a site's facts beat your generic defaults (your ``partition = "gpu"`` from home
   must not follow you to LUMI; put per-site values in profiles.toml instead);
4. this file;
5. the built-in default.

``torchhpc config show`` prints each value with its source.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchhpc.core.units import is_off, parse_timeout, parse_walltime
from torchhpc.errors import ConfigError, SpecError, TorchHPCError

__all__ = [
    "CONFIG_KEYS",
    "Value",
    "as_given",
    "config_path",
    "flight_recorder_value",
    "hang_timeout_value",
    "load_config",
    "pick",
    "pick_profile",
    "serve_slurm",
]

CONFIG_KEYS: dict[str, str] = {
    "scheduler": "default scheduler: local, slurm, pbs, kubernetes or runai",
    "profile": "site profile used when no --profile is given",
    "account": "account/project to charge (--account)",
    "partition": "Slurm partition (--partition)",
    "qos": "Slurm quality of service (--qos)",
    "queue": "PBS queue (--queue)",
    "time": "default time limit, e.g. 01:00:00 (--time)",
    "spares": "spare nodes allocated beside the job's, used after a node failure (--spares)",
    "min_nodes": "the fewest nodes a job goes on with after a node loss with no spare left (--min-nodes)",
    "max_restarts": "restarts inside the allocation after a node failure, hang or network error (--max-restarts)",
    "hang_timeout": "seconds without output or CPU use after which ranks count as hung, or off (--hang-timeout)",
    "max_no_progress": "attempts in a row without a checkpoint advance before the job ends with no-progress; 0: never (--max-no-progress)",
    "checkpoint_dir": "where the program saves checkpoints; the newest one's step tells the supervisor it advanced (--checkpoint-dir)",
    "flight_recorder": "collectives each rank's Flight Recorder keeps for the hang verdict, or off (--flight-recorder)",
    "remote": "[USER@]HOST whose torchhpc runs run/status/logs/... over ssh (--remote; docs/remote.md)",
}


def config_path(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    if env.get("TORCHHPC_CONFIG"):
        return Path(env["TORCHHPC_CONFIG"]).expanduser()
    base = env.get("XDG_CONFIG_HOME") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".config")
    return Path(base) / "torchhpc" / "config.toml"


def load_config(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The file's values (``{}`` when there is none), validated."""
    env = os.environ if environ is None else environ
    path = config_path(env)
    if not path.exists():
        if env.get("TORCHHPC_CONFIG"):
            raise ConfigError(
                f"TORCHHPC_CONFIG names {str(path)!r}, which does not exist",
                "fix the path or unset TORCHHPC_CONFIG",
            )
        return {}
    from torchhpc.profiles import _not_utf8, _toml_loads

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(_not_utf8(path, e), "save it as UTF-8 (TOML files are UTF-8)") from None
    data = _toml_loads(text, str(path))
    out: dict[str, str] = {}
    for key, value in data.items():
        if key not in CONFIG_KEYS:
            from torchhpc.core.suggest import did_you_mean

            near = did_you_mean(key, CONFIG_KEYS)
            raise ConfigError(f"unknown key {key!r} in {path}", (f"{near} " if near else "") + "valid keys: " + ", ".join(CONFIG_KEYS))
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise ConfigError(f"{key} = {value!r} in {path} is not a string", f"{key}: {CONFIG_KEYS[key]}")
        out[key] = str(value)
    if "scheduler" in out:
        from torchhpc.schedulers import REGISTRY

        if out["scheduler"] not in REGISTRY:
            raise ConfigError(
                f"scheduler = {out['scheduler']!r} in {path} is not a scheduler",
                f"choose one of: {', '.join(REGISTRY)}",
            )
    if "time" in out:
        parse_walltime(out["time"], f"time in {path}")
    return out


@dataclass(frozen=True)
class Value:
    """A resolved value and where it came from (``torchhpc config show`` prints both)."""

    value: Any
    source: str


def hang_timeout_value(text: object) -> float:
    """``--hang-timeout S|off`` from a variable or the config file: seconds, 0.0 for off (core/units.py's grammar;
    the floor is JobSpec's check, one message wherever the value came from)."""
    try:
        return parse_timeout(text, "--hang-timeout", floor=0)
    except SpecError as e:  # named with its source by pick()
        raise ValueError(e.message) from None


def flight_recorder_value(text: object) -> str:
    """``--flight-recorder N|off``: collectives kept per rank (1 to 1000000), or off."""
    value = str(text).strip().lower()
    if is_off(value):
        return "off"
    if value.isdigit() and 0 < int(value) <= 1_000_000:
        return value
    raise ConfigError(f"--flight-recorder {text!r} is neither a number of collectives nor off",
                      "e.g. --flight-recorder 2000 (the default) or --flight-recorder off")


def pick_profile(given: Any, environ: Mapping[str, str], config: Mapping[str, str] | None) -> Value:
    """The site profile by the usual precedence; ``--profile none`` (or ``''``, ``$TORCHHPC_PROFILE=none``)
    means no profile, whatever the config file names: the way to run once without the site's defaults."""
    v = pick("profile", given, flag="--profile", environ=environ, config=config)
    if v.value is not None and str(v.value).strip().lower() in ("none", ""):
        return Value(None, f"{v.source}: none")
    return v


def pick(
    key: str,
    given: Any,
    *,
    flag: str,
    environ: Mapping[str, str],
    profile: Any = None,
    config: Mapping[str, str] | None = None,
    default: Any = None,
    cast: Any = None,
) -> Value:
    """One value by the documented precedence: given > TORCHHPC_<KEY> > profile > config file > default."""
    if given is not None:
        if cast is not None and isinstance(given, str):  # Job(hang_timeout="x"): the CLI's parser casts its own
            try:
                given = cast(given)
            except ValueError:
                raise ConfigError(f"{flag} {given!r} is not valid", "give a number") from None
        return Value(given, f"command line ({flag})")
    var = "TORCHHPC_" + key.upper()
    if var in environ and environ[var] != "":
        raw = environ[var]
        try:
            return Value(cast(raw) if cast else raw, f"${var}")
        except ValueError:
            raise ConfigError(f"${var}={raw!r} is not valid for {flag}", "unset it or fix its value") from None
    if profile is not None and getattr(profile, key, None) not in (None, (), ""):
        return Value(getattr(profile, key), f"profile {profile.name}")
    if config and key in config:
        raw = config[key]
        try:
            return Value(cast(raw) if cast else raw, f"config file ({config_path(environ)})")
        except ValueError:
            raise ConfigError(f"{key} = {raw!r} in {config_path(environ)} is not valid") from None
    return Value(default, "built-in default")


@contextlib.contextmanager
def as_given(v: Value, flag: str) -> Iterator[None]:
    """An error about ``flag VALUE`` named as the user gave it: ``$TORCHHPC_SCHEDULER='x'`` or the profile's key,
    not a flag nobody typed (a flag given, or ``Job(scheduler=...)``, keeps the flag's words: Job renames them)."""
    try:
        yield
    except TorchHPCError as e:
        said = f"{flag} {v.value!r}"
        if v.source.startswith("$"):
            e.message = e.message.replace(said, f"{v.source}={v.value!r}", 1)
        elif v.source.startswith("profile"):
            e.message = e.message.replace(said, f"{flag.lstrip('-')} {v.value!r} (from {v.source})", 1)
        e.args = (e.message,)
        raise


def _devcluster_env() -> dict[str, str] | None:
    from torchhpc.devcluster import load_state

    state = load_state()
    return state.client_env() if state is not None else None


def serve_slurm() -> None:
    """Let a running dev cluster serve Slurm commands on a machine without a Slurm of its own: the CLI, the
    Python API (``Job``, ``Executor``) and ``shell`` all take this one target (asked at the first command
    only: a dry run probes nothing; a site's own slurm.conf always wins, schedulers/slurm/site.py)."""
    from torchhpc.schedulers import SITE_ENV

    providers = SITE_ENV.setdefault("slurm", [])
    if _devcluster_env not in providers:
        providers.append(_devcluster_env)
