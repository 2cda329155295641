"""Helpers shared by the pod-based backends (Kubernetes TrainJob/PyTorchJob and RunAI): names, options, volumes."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import NamedTuple

from torchhpc.core.spec import JobSpec
from torchhpc.errors import SpecError

__all__ = ["RDMA_ANNOTATION", "Claim", "k8s_name", "normalized_options", "pairs", "volume_claims"]

# Multus network attachment annotation (the RunAI on RCP guide's RDMA/RoCE network on RCP).
RDMA_ANNOTATION = "k8s.v1.cni.cncf.io/networks"

# A PVC name is a DNS-1123 subdomain; a mount path is absolute and has no comma (the lists are comma separated).
_CLAIM = re.compile(r"[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?")


def normalized_options(spec: JobSpec) -> dict[str, str]:
    """Option keys with ``-`` read as ``_`` (``large-shm`` = ``large_shm``), as profiles write RunAI's flag names."""
    return {k.replace("-", "_"): v for k, v in spec.options}


def k8s_name(name: str) -> str:
    """A DNS-1123 label (what RunAI and Kubernetes accept as a job name)."""
    safe = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:50].strip("-")
    if not safe or not safe[0].isalpha():
        safe = ("job-" + safe).strip("-")
    return safe


def pairs(opts: Mapping[str, str], key: str) -> list[tuple[str, str]]:
    """``--opt KEY=a=1,b=2`` -> ``[("a", "1"), ("b", "2")]``; an item without ``=`` is an error naming it."""
    out = []
    for item in (opts.get(key) or "").split(","):
        if item.strip():
            name, sep, value = item.strip().partition("=")
            if not sep or not name:
                raise SpecError(f"{key} {item!r} (from --opt {key}=...) is not NAME=VALUE")
            out.append((name, value))
    return out


class Claim(NamedTuple):
    """One PVC mounted into every pod."""

    claim: str
    path: str
    read_only: bool


def volume_claims(spec: JobSpec, opts: Mapping[str, str]) -> list[Claim]:
    """PVC mounts from ``--opt pvc=CLAIM:/path,...`` and ``--bind CLAIM:/path[:ro]``.

    A pod cannot bind a directory of the submitting machine: ``--bind`` names a
    PersistentVolumeClaim there, and a host path (``/data:/data``) is refused
    rather than silently dropped.
    """
    items = [(i.strip(), "pvc (from --opt pvc=...)") for i in (opts.get("pvc") or "").split(",") if i.strip()]
    binds = [*(spec.container.binds if spec.container else ()), *(opts.get("bind") or "").split(",")]
    items += [(b.strip(), "--bind") for b in binds if b.strip()]
    out: list[Claim] = []
    for item, source in items:
        parts = item.split(":")
        read_only = len(parts) == 3 and parts[2] == "ro"
        if len(parts) == 3 and not read_only:
            raise SpecError(f"{source} {item!r}: the third field must be 'ro'", "write CLAIM:/mount/path[:ro]")
        if parts[0].startswith(("/", ".", "~")) and source == "--bind":
            raise SpecError(
                f"--bind {item!r} names a path on this machine, which no pod can mount",
                "pods mount PersistentVolumeClaims: --bind CLAIM:/mount/path (or --opt pvc=CLAIM:/mount/path)",
            )
        if len(parts) not in (2, 3) or not _CLAIM.fullmatch(parts[0]) or not parts[1].startswith("/"):
            raise SpecError(f"{source} {item!r} is not CLAIM:/mount/path", "e.g. mlo-scratch:/mloscratch")
        out.append(Claim(parts[0], parts[1], read_only))
    return out
