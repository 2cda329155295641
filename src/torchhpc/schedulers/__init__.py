"""Scheduler backends, loaded lazily by name.

Importing this package loads no backend: ``get_scheduler("slurm")`` imports
``torchhpc.schedulers.slurm.slurm`` on first use, so the CLI stays fast and optional
dependencies (the kubernetes client) stay optional.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from torchhpc.errors import UsageError

if TYPE_CHECKING:
    from torchhpc.core.proc import Runner
    from torchhpc.schedulers.api import Scheduler

# name -> "module:Class"
REGISTRY: dict[str, str] = {
    "local": "torchhpc.schedulers.local.local:LocalScheduler",
    "slurm": "torchhpc.schedulers.slurm.slurm:SlurmScheduler",
    "pbs": "torchhpc.schedulers.pbs.pbs:PBSScheduler",
    "kubernetes": "torchhpc.schedulers.kubernetes.kubernetes:KubernetesScheduler",
    "runai": "torchhpc.schedulers.runai.runai:RunAIScheduler",
}


# Where a backend's client commands find a cluster when this machine has none of its own:
# scheduler name -> providers of an environment (``SLURM_CONF``, ``PATH``...), tried in order at the
# first command, never at render time. The CLI registers `torchhpc devcluster` here: the dev
# cluster lives above this layer, so the backends cannot import it themselves.
SITE_ENV: dict[str, list[Callable[[], Mapping[str, str] | None]]] = {}


# scheduler name -> "module:function" starting what every submission of it asks its cluster first, called by `run`
# before the CLI imports the rest, so that the answer comes while it does (a round trip of a 0.1 s submit).
EARLY: dict[str, str] = {"slurm": "torchhpc.schedulers.slurm.site:ask_sinfo_early"}


def ask_early(words: Sequence[str]) -> None:
    """``run WORDS``: a scheduler named by ``-s``/``--scheduler`` with an :data:`EARLY` question starts it now;
    not for a dry run or a line forwarded to a login node. A guess wrong (the word was the program's) costs one
    question the submit then never takes."""
    named = [n for w, n in zip(words, [*words[1:], ""]) if w in ("-s", "--scheduler")]
    named += [w.split("=", 1)[1] for w in words if w.startswith("--scheduler=")]
    named += [w[2:] for w in words if w.startswith("-s") and len(w) > 2 and not w.startswith("--")]
    if not named or named[0] not in EARLY or {"--dry-run", "--remote"} & set(words) or os.environ.get("TORCHHPC_REMOTE"):
        return
    mod, fn = EARLY[named[0]].split(":")
    getattr(importlib.import_module(mod), fn)()


def scheduler_names() -> list[str]:
    return list(REGISTRY)


def scheduler_class(name: str) -> type[Scheduler]:
    """The backend's class, for its declared capabilities (``supports_*``, ``runs_here``...) without an instance."""
    if name not in REGISTRY:
        from torchhpc.core.suggest import did_you_mean

        near = did_you_mean(name, REGISTRY)
        raise UsageError(
            f"--scheduler {name!r} is not a scheduler", (f"{near} " if near else "") + f"choose one of: {', '.join(REGISTRY)}"
        )
    mod, cls = REGISTRY[name].split(":")
    try:
        module = importlib.import_module(mod)
    except ModuleNotFoundError as e:
        if e.name == mod:
            raise UsageError(f"the {name} scheduler is not available in this build") from None
        raise
    found: type[Scheduler] = getattr(module, cls)
    return found


def get_scheduler(name: str, runner: Runner | None = None) -> Scheduler:
    return scheduler_class(name)(runner=runner)


def parse_handle(handle: str, default: str = "slurm") -> tuple[str, str]:
    """``slurm:123`` -> ("slurm", "123"); a bare ``123`` uses ``default`` (core/handle.py; ``slrum:1`` is a
    mistyped scheduler, said so with the nearest names)."""
    from torchhpc.core.handle import Handle

    h = Handle.parse(handle, default, tuple(REGISTRY))
    return h.scheduler, h.job_id


def capabilities_table() -> str:
    """docs/capabilities.md's tables, for every registered backend (see :func:`capabilities.markdown`)."""
    from torchhpc.schedulers.capabilities import markdown

    return markdown({name: scheduler_class(name) for name in REGISTRY})
