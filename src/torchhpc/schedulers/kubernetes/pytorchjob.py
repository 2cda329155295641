"""The training-operator v1 ``PyTorchJob`` (``--opt api=pytorchjob``): one Master pod plus ``nodes - 1``
Workers, each running torchrun once. The operator sets ``MASTER_ADDR``/``MASTER_PORT`` and ``RANK`` (the
pod's index; newer ones also ``PET_NODE_RANK``); its ``WORLD_SIZE`` counts pods in older releases and
processes in newer ones, so ``--nnodes`` is written in at render time. kubernetes.py submits it."""

from __future__ import annotations

from typing import Any

from torchhpc.core.shell import Raw, join, wrap_command
from torchhpc.core.spec import JobSpec
from torchhpc.network.presets import auto_lines, wants_auto
from torchhpc.schedulers.kubernetes import bootmap
from torchhpc.schedulers.kubernetes import trainjob as tj
from torchhpc.schedulers.kubernetes.pods import k8s_name, normalized_options, pairs

__all__ = ["CONTAINER", "GROUP_PATH", "manifest", "pod_script"]

GROUP_PATH = "/apis/kubeflow.org/v1"
CONTAINER = "pytorch"  # the operator finds the training container by this name
PORT_NAME, PORT = "pytorchjob-port", 23456  # the operator's defaults, written out


def pod_script(spec: JobSpec, python: str) -> str:
    """``bash -c`` text: torchrun over pods. The script's own arguments arrive as ``"$@"``,
    so they are never parsed by a shell."""
    argv = tj.pod_torchrun(spec, python, '"${PET_NODE_RANK:-$RANK}"')
    start = ""
    if spec.network and wants_auto(spec.network):
        # --network auto at pod start: NCCL_IB_GID_INDEX, NCCL_IB_HCA... from this pod's sysfs.
        start = "".join(ln + "\n" for ln in auto_lines(python) if not ln.startswith("#"))
    # The exit cures (launchers/boot.py): the boot ConfigMap first on PYTHONPATH, torchrun's workers inherit it.
    return bootmap.pod_lines(normalized_options(spec)) + start + "\n".join(wrap_command("exec " + join([*argv, Raw('"$@"')]), indent=""))


def manifest(spec: JobSpec, image: str, namespace: str) -> dict[str, Any]:
    """The PyTorchJob object, as plain data (the same dict is YAML for kubectl and JSON for the API)."""
    opts = normalized_options(spec)
    spec = spec.with_(options=tuple(opts.items()))
    python = spec.entrypoint.python or "python"
    limits = tj.resources(spec, opts)
    volumes, mounts = tj.pod_volumes(spec, opts)
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": image,
        "imagePullPolicy": opts.get("image_pull_policy", "IfNotPresent"),
        "command": ["bash", "-c", pod_script(spec, python), "torchhpc-pod", *spec.entrypoint.args[len(tj.lead(spec)):]],
    }
    if opts.get("workdir"):
        container["workingDir"] = opts["workdir"]
    # For torchhpc's env detector: the operator's RANK/WORLD_SIZE count pods, this says how many processes each.
    env = [("TORCHHPC_NPROC_PER_NODE", str(spec.nproc_per_node)), *spec.env]
    container["env"] = [{"name": k, "value": v} for k, v in env]
    container["ports"] = [{"name": PORT_NAME, "containerPort": PORT}]
    if limits:
        container["resources"] = {"limits": limits, "requests": dict(limits)}
    container["volumeMounts"] = mounts
    pod_spec: dict[str, Any] = {"containers": [container], "volumes": volumes}
    if opts.get("service_account"):
        pod_spec["serviceAccountName"] = opts["service_account"]
    if opts.get("node_selector"):
        pod_spec["nodeSelector"] = dict(pairs(opts, "node_selector"))
    if opts.get("toleration"):
        pod_spec["tolerations"] = tj.tolerations(opts)
    template = tj.pod_template(pod_spec, opts)
    restart = opts.get("restart_policy", "Never")
    replicas: dict[str, Any] = {"Master": {"replicas": 1, "restartPolicy": restart, "template": template}}
    if spec.nodes > 1:
        replicas["Worker"] = {"replicas": spec.nodes - 1, "restartPolicy": restart, "template": template}
    # --max-restarts is runPolicy.backoffLimit (the larger of the two, when both are given)
    backoff = max(int(opts.get("backoff_limit", "0")), spec.max_restarts)
    run_policy: dict[str, Any] = {"cleanPodPolicy": "None", "backoffLimit": backoff}
    if spec.time_seconds:
        run_policy["activeDeadlineSeconds"] = spec.time_seconds
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": k8s_name(spec.name), "namespace": namespace, "labels": tj.job_labels(opts)},
        "spec": {
            "nprocPerNode": str(spec.nproc_per_node),
            "runPolicy": run_policy,
            "pytorchReplicaSpecs": replicas,
        },
    }
