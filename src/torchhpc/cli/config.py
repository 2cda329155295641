"""``torchhpc config show``: every job default, its value and where it comes from."""

from __future__ import annotations

import argparse
from typing import Any

from torchhpc.cli.common import add_subparser, print_json

DESCRIPTION = """Show the defaults a job would get, each with its source.

Precedence, first found wins: the command line, then the TORCHHPC_* variable
(TORCHHPC_ACCOUNT for --account), then the profile (--profile, $TORCHHPC_PROFILE or
the file's profile), then the config file, then the built-in default.

The config file is $TORCHHPC_CONFIG, else $XDG_CONFIG_HOME/torchhpc/config.toml
(default ~/.config/torchhpc/config.toml), with top-level keys:

  scheduler = "slurm"
  profile = "mn5"
  account = "bsc98"
  qos = "acc_bsccs"
  time = "00:30:00"

Valid keys (each also a flag of `torchhpc run`):
"""


def _description() -> str:
    """DESCRIPTION with every key the file accepts, from config.CONFIG_KEYS (the one list)."""
    from torchhpc.config import CONFIG_KEYS

    return DESCRIPTION + "".join(f"  {k:<16} {v}\n" for k, v in CONFIG_KEYS.items())


def register(sub: Any) -> None:
    p = add_subparser(sub, "config", "show the per-user defaults (~/.config/torchhpc/config.toml) and their sources",
                      _description())
    csub = p.add_subparsers(dest="config_command", metavar="ACTION")
    show = add_subparser(csub, "show", "each default, its value and its source", _description())
    show.add_argument("--profile", default=None, help="as if run with --profile NAME")
    show.add_argument("--json", action="store_true", help="machine-readable output")
    show.set_defaults(func=cmd_show)
    path = add_subparser(csub, "path", "print where the config file is read from")
    path.set_defaults(func=cmd_path)
    p.set_defaults(func=cmd_show, profile=None, json=False)


# A default that is not torchhpc's to set but the program's boot's (boot/sitecustomize.py FR_DEFAULT, held
# equal by a test): shown as the value a job gets, not "(unset)".
BOOT_DEFAULTS = {"flight_recorder": "2000"}


def cmd_show(args: argparse.Namespace) -> int:
    import os

    from torchhpc.config import CONFIG_KEYS, config_path, load_config, pick
    from torchhpc.resolve import resolve_values

    _, values = resolve_values({"profile": args.profile})
    values["remote"] = pick("remote", None, flag="--remote", environ=os.environ, config=load_config(os.environ))
    for key, default in BOOT_DEFAULTS.items():
        if values[key].value is None:
            values[key] = type(values[key])(default, "built-in default (each rank's)")
    if args.json:
        print_json({k: {"value": v.value, "source": v.source, "config_key": k in CONFIG_KEYS}
                    for k, v in values.items()}, indent=1)
        return 0
    path = config_path()
    print(f"# config file: {path}{'' if path.exists() else ' (none)'}")
    # a key the file refuses is not offered as one
    print("# flags or profiles only, not config file keys: " + ", ".join(k for k in values if k not in CONFIG_KEYS))
    shown = {k: ("(unset)" if v.value is None else str(v.value), v.source) for k, v in values.items()}
    width = max(len(k) for k in shown)
    vwidth = max(len(v) for v, _ in shown.values())
    for key, (value, source) in shown.items():
        print(f"{key.ljust(width)}  {value.ljust(vwidth)}  {source}")
    return 0


def cmd_path(args: argparse.Namespace) -> int:
    from torchhpc.config import config_path

    print(config_path())
    return 0
