"""The boot file in pods, once per cluster: a ConfigMap ``torchhpc-boot-<hash>`` mounted read-only.

Pods run torchrun, which starts the ranks: they need only the boot ``sitecustomize.py`` (the exit
cures, launchers/boot.py) first on PYTHONPATH. ``schedule`` creates the ConfigMap, named by its
content's hash, in the job's namespace if it is absent (``AlreadyExists``/409 is success: jobs share
it); every pod mounts it at :data:`MOUNT`. Where it cannot be created (RBAC without ``create
configmaps``, a quota), the job is submitted with the file inline instead, as ``--opt boot=inline``
renders it: the pod's shell writes it to a private directory (:func:`~torchhpc.launchers.boot.boot_shell`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from typing import Any

from torchhpc.errors import CommandError, SchedulerError
from torchhpc.launchers.boot import SWITCH, boot_shell, boot_source

__all__ = ["MOUNT", "VOLUME", "add_mount", "configmap", "create", "inline", "map_name", "pod_lines"]

MOUNT = "/etc/torchhpc/boot"
VOLUME = "torchhpc-boot"


def map_name() -> str:
    return "torchhpc-boot-" + hashlib.sha256(boot_source().encode()).hexdigest()[:12]


def inline(opts: Mapping[str, str]) -> bool:
    """``--opt boot=inline``: the boot file in the pod's command, for namespaces without ConfigMaps."""
    return opts.get("boot", "configmap") == "inline"


def pod_lines(opts: Mapping[str, str]) -> str:
    """The pod script's first lines: the mounted directory first on PYTHONPATH (or, inline, the file written)."""
    if inline(opts):
        return boot_shell()
    return f'if [ "${{{SWITCH}:-1}}" != 0 ]; then export PYTHONPATH="{MOUNT}${{PYTHONPATH:+:$PYTHONPATH}}"; fi\n'


def add_mount(opts: Mapping[str, str], volumes: list[dict[str, Any]], mounts: list[dict[str, Any]]) -> None:
    if not inline(opts):
        volumes.append({"name": VOLUME, "configMap": {"name": map_name()}})
        mounts.append({"name": VOLUME, "mountPath": MOUNT, "readOnly": True})


def configmap(namespace: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": map_name(), "namespace": namespace,
                         "labels": {"app.kubernetes.io/managed-by": "torchhpc"}},
            "data": {"sitecustomize.py": boot_source()}}


def create(namespace: str, kubectl: Callable[[dict[str, Any]], object] | None,
           post: Callable[[str, dict[str, Any]], object] | None) -> bool:
    """Create the ConfigMap unless it exists; False when it cannot be created (the caller falls back to inline)."""
    obj = configmap(namespace)
    try:
        if kubectl is not None:
            kubectl(obj)
        elif post is not None:
            post(f"/api/v1/namespaces/{namespace}/configmaps", obj)
    except CommandError as e:
        return "AlreadyExists" in (e.stderr or "") or "already exists" in (e.stderr or "")
    except SchedulerError as e:
        return "HTTP 409" in e.message
    return True
