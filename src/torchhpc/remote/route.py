"""Whether a command line goes to another host (``--remote``), decided before anything is shipped.

Its own module because the CLI asks it for every command line: a local ``run`` must not load the
shipping and ssh machinery (:mod:`.forward`, :mod:`.ship`, :mod:`.ssh`) to learn that it stays here.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from torchhpc.errors import UsageError

__all__ = ["ENV_LIMIT", "ENV_SIDE", "FLAGS", "REMOTE_COMMANDS", "SHIPPING_COMMANDS", "check_host", "extract", "target"]

# Where TORCHHPC_REMOTE / the config's `remote` key send a command without --remote.
REMOTE_COMMANDS = ("run", "sweep", "status", "logs", "wait", "cancel", "list", "diagnose", "top")
SHIPPING_COMMANDS = ("run", "sweep")
ENV_SIDE = "TORCHHPC_REMOTE_SIDE"  # set on the remote side: it never forwards again
ENV_LIMIT = "TORCHHPC_SHIP_LIMIT"
FLAGS = {"--remote": "remote", "--ship": "ship", "--ship-limit": "ship_limit"}


def check_host(host: str, source: str = "--remote") -> str:
    """``[USER@]HOST`` as ssh takes it; a leading ``-`` would be read as an ssh option."""
    if not host or host.startswith("-") or any(c.isspace() or ord(c) < 32 for c in host):
        raise UsageError(f"{source} {host!r} is not a host", "give [USER@]HOST, or a Host name from your ssh config")
    return host


def extract(argv: Sequence[str], own: int) -> tuple[dict[str, str], list[str]]:
    """Take ``--remote``/``--ship``/``--ship-limit`` (and ``=`` forms) out of ``argv[1:1+own]``."""
    found: dict[str, str] = {}
    out = [argv[0]]
    words = list(argv[1 : 1 + own])
    i = 0
    while i < len(words):
        name, eq, value = words[i].partition("=")
        if name in FLAGS:
            if not eq:
                if i + 1 >= len(words):
                    raise UsageError(f"{name} needs a value", "e.g. --remote user@login.cluster.org")
                value = words[i + 1]
                i += 1
            found[FLAGS[name]] = value
        else:
            out.append(words[i])
        i += 1
    return found, out + list(argv[1 + own :])


def target(command: str, given: str | None, profile: str | None = None) -> tuple[str, str] | None:
    """(host, where it came from) for this command, or None to run it here.

    ``--remote`` > ``$TORCHHPC_REMOTE`` > the profile's ``remote`` > the config file's.
    The remote side (``$TORCHHPC_REMOTE_SIDE``) never forwards again.
    """
    if os.environ.get(ENV_SIDE):
        return None
    if given is not None:
        return check_host(given), "--remote"
    if command not in REMOTE_COMMANDS:
        return None
    from torchhpc.config import as_given, load_config, pick, pick_profile

    env = os.environ
    config = load_config(env)
    prof_v = pick_profile(profile, env, config)
    prof_name = prof_v.value
    prof = None
    if prof_name:
        from torchhpc.profiles import get_profile

        with as_given(prof_v, "--profile"):  # $TORCHHPC_PROFILE='x', not a --profile nobody typed
            prof = get_profile(str(prof_name), env)
    v = pick("remote", None, flag="--remote", environ=env, profile=prof, config=config)
    if not v.value:
        return None
    return check_host(str(v.value), v.source), v.source
