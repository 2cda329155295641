"""Which Slurm the backend's commands go to: the machine's own, else a registered stand-in (a dev cluster)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from torchhpc.core.proc import Runner, start_early

__all__ = ["SINFO_ARGV", "SITE_CONFS", "ask_sinfo_early", "dev_target", "site_env", "site_runner"]

# Where a site's own Slurm configuration lives when $SLURM_CONF does not say (Slurm's default, Debian's).
SITE_CONFS = ("/etc/slurm/slurm.conf", "/etc/slurm-llnl/slurm.conf")

SINFO_NODES = "%N|%P|%c|%m"  # name, partition (a * marks the default), CPUs, RealMemory in MB
SINFO_ARGV = ("sinfo", "-h", "-N", "-o", SINFO_NODES)  # what every submission asks first (slurm/fits.py)


def ask_sinfo_early() -> None:
    """Start the sinfo that slurm/fits.py asks before sbatch (``schedulers.ask_early``), for the site's own Slurm
    only: a dev cluster's environment is known later (``site_env``), and an early answer is taken only by a run
    of the same argv in the same environment (core/proc.py)."""
    if os.environ.get("SLURM_CONF") or any(os.path.exists(p) for p in SITE_CONFS):
        start_early(SINFO_ARGV)


def site_env() -> Mapping[str, str] | None:
    """The machine's own Slurm when it has one; else a provider registered in ``SITE_ENV`` (the CLI
    registers a running ``torchhpc devcluster``, so that ``devcluster up`` followed by a plain
    ``torchhpc run --scheduler slurm`` works without exporting anything by hand).

    The site's configuration wins: with ``$SLURM_CONF`` set or a ``slurm.conf`` in its default
    place, no provider is asked, even if a dev cluster runs (docs/slurm-target.md says the rule)."""
    if os.environ.get("SLURM_CONF") or any(os.path.exists(p) for p in SITE_CONFS):
        return None
    from torchhpc.schedulers import SITE_ENV

    for provider in SITE_ENV.get("slurm", ()):
        try:
            env = provider()
        except Exception:  # a broken dev cluster state file must not break a real site
            env = None
        if env is not None:
            return env
    return None


def dev_target() -> str | None:
    """One line naming the stand-in that Slurm commands go to (a dev cluster), or None for the site's own Slurm."""
    env = site_env()
    if env is None:
        return None
    return (f"Slurm target: the torchhpc dev cluster (SLURM_CONF={env.get('SLURM_CONF', '?')}), "
            "as this machine has no Slurm configuration of its own ($SLURM_CONF unset, no /etc/slurm/slurm.conf)")


def site_runner() -> Runner:
    """Looked up at the first command, not here: a dry run probes nothing."""
    return Runner(env_factory=site_env)
