"""Helpers shared by the pod-based backends (Kubernetes PyTorchJob and RunAI): names, options, RDMA."""

from __future__ import annotations

import re

from torchhpc.core.spec import JobSpec

__all__ = ["RDMA_ANNOTATION", "k8s_name", "normalized_options"]

# Multus network attachment annotation (seed 004's RDMA/RoCE network on RCP).
RDMA_ANNOTATION = "k8s.v1.cni.cncf.io/networks"


def normalized_options(spec: JobSpec) -> dict[str, str]:
    """Option keys with ``-`` read as ``_`` (``large-shm`` = ``large_shm``), as profiles write RunAI's flag names."""
    return {k.replace("-", "_"): v for k, v in spec.options}


def k8s_name(name: str) -> str:
    """A DNS-1123 label (what RunAI and Kubernetes accept as a job name)."""
    safe = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:50].strip("-")
    if not safe or not safe[0].isalpha():
        safe = ("job-" + safe).strip("-")
    return safe
