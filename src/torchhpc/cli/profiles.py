"""``torchhpc profiles``: list the site profiles, show one with its resolved values."""

from __future__ import annotations

import argparse
import json
from typing import Any

from torchhpc.cli.common import add_subparser


def register(sub: Any) -> None:
    p = add_subparser(
        sub,
        "profiles",
        "site profiles: built-ins (mn5, lumi, alliance-cc, sockeye, rcp) and ~/.config/torchhpc/profiles.toml",
        description=(
            "Site profiles give a scheduler, partition/QoS/account, GPUs and CPUs per node, modules,\n"
            "container runtime, network preset, CPU binding and extra env. Use one with\n"
            "`torchhpc run --profile NAME`. User profiles: $TORCHHPC_PROFILES or\n"
            "~/.config/torchhpc/profiles.toml (a [NAME] table per profile; a built-in's name extends it)."
        ),
    )
    psub = p.add_subparsers(dest="profiles_command", metavar="ACTION")
    ls = add_subparser(psub, "list", "list profile names and what they are")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_list)
    show = add_subparser(psub, "show", "show one profile's resolved values")
    show.add_argument("name")
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=cmd_show)
    keys = add_subparser(psub, "keys", "the keys a profile may set")
    keys.set_defaults(func=cmd_keys)
    p.set_defaults(func=cmd_list, json=False)


def cmd_list(args: argparse.Namespace) -> int:
    from torchhpc.profiles import get_profile, list_profiles, load_user_profiles

    names = list_profiles()
    profiles = [get_profile(n) for n in names]
    user = load_user_profiles()
    if getattr(args, "json", False):
        print(json.dumps({p.name: p.description for p in profiles}, indent=2))
        return 0
    width = max(len(n) for n in names)
    for p in profiles:
        # Marked when the user's profiles.toml defines or changes it (get_profile finalizes both alike).
        origin = "  (user)" if p.name in user else ""
        print(f"{p.name.ljust(width)}  {p.description}{origin}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from torchhpc.profiles import get_profile

    prof = get_profile(args.name)
    data = prof.to_dict()
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    width = max(len(k) for k in data)
    for key, value in data.items():
        if isinstance(value, dict):
            text = ", ".join(f"{k}={v}" for k, v in value.items())
        elif isinstance(value, list):
            text = "\n".join(([str(value[0])] if value else []) + [" " * (width + 2) + str(v) for v in value[1:]])
        else:
            text = str(value)
        print(f"{key.ljust(width)}  {text}")
    if prof.setup_lines():
        print("\n# batch script setup:")
        print("\n".join(prof.setup_lines()))
    return 0


def cmd_keys(args: argparse.Namespace) -> int:
    from torchhpc.profiles import FIELD_DOCS

    width = max(len(k) for k in FIELD_DOCS)
    for k, doc in FIELD_DOCS.items():
        if k != "name":
            print(f"{k.ljust(width)}  {doc}")
    return 0
