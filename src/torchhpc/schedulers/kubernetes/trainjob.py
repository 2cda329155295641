"""Kubeflow Trainer v2: a ``TrainJob`` (``trainer.kubeflow.org/v1alpha1``), the default Kubernetes render.

Why TrainJob: Training Operator v1 (``PyTorchJob``) left kubeflow/trainer's main
branch in 2025, and Kueue's PyTorchJob integration is off by default since
v0.19, so a queued cluster admits TrainJobs, not PyTorchJobs. The facts this
module relies on (Trainer v2.3.0, checked against its CRD and its torch plugin):

* no master/worker split: ``trainer.numNodes`` counts every node, and a
  ``ClusterTrainingRuntime`` (``torch-distributed`` by default) supplies the pod
  template, with one replicated job and one container, both named ``node``;
* the controller injects ``PET_NNODES``, ``PET_NPROC_PER_NODE``,
  ``PET_NODE_RANK`` (the Job completion index), ``PET_MASTER_ADDR``
  (``NAME-node-0-0.NAME``) and ``PET_MASTER_PORT`` (29500) into ``node``, and
  its webhook rejects a TrainJob whose ``trainer.env`` sets any of them; no
  ``MASTER_ADDR``/``RANK``/``WORLD_SIZE`` as PyTorchJob had;
* ``numProcPerNode`` unset means one process per requested CPU on a CPU job,
  so it is always written from the job's geometry;
* pod-level changes go through ``runtimePatches`` (volumes, nodeSelector,
  tolerations, annotations, the ``node`` container's volumeMounts); image,
  command, env and resources of ``node`` only through ``trainer`` (the patch
  schema has no ``resources`` on containers, so ``rdma/rdma`` is a per-node
  resource too);
* the name is an RFC 1035 label of at most 63 characters (CEL rules of the CRD);
* Kueue reads the queue from the label ``kueue.x-k8s.io/queue-name``.

The pods carry the JobSet label ``jobset.sigs.k8s.io/jobset-name=NAME`` and the
Job label ``batch.kubernetes.io/job-completion-index`` (the node rank), which is
how :mod:`torchhpc.schedulers.kubernetes.kubernetes` finds one rank's pod.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from torchhpc.core.shell import Raw, join, wrap_command
from torchhpc.core.spec import JobSpec
from torchhpc.core.units import parse_size
from torchhpc.errors import SpecError
from torchhpc.launchers import torchrun_argv
from torchhpc.network.presets import auto_lines, wants_auto
from torchhpc.schedulers.api import JobStatus
from torchhpc.schedulers.kubernetes import bootmap
from torchhpc.schedulers.kubernetes.pods import RDMA_ANNOTATION, pairs, volume_claims
from torchhpc.schedulers.kubernetes.runtime import RUNTIME_KIND, runtime_name

__all__ = [
    "API_VERSION",
    "CRD",
    "DEFAULT_RUNTIME",
    "GROUP_PATH",
    "INDEX_LABEL",
    "JOBSET_LABEL",
    "QUEUE_LABEL",
    "RESERVED_ENV",
    "status_from_trainjob",
    "trainjob",
    "trainjob_name",
]

API_VERSION = "trainer.kubeflow.org/v1alpha1"
GROUP_PATH = "/apis/" + API_VERSION
CRD = "trainjobs.trainer.kubeflow.org"
DEFAULT_RUNTIME = "torch-distributed"
NODE = "node"  # the torch runtimes' replicated job and container
MANAGER = "torchhpc"  # our entry in runtimePatches (one entry per manager)
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
RESERVED_ENV = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")
_RFC1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")

# Options a TrainJob cannot carry: the runtime owns them (runtimePatches cannot reach them).
REFUSED = {
    "restart_policy": "the runtime's Job template decides restarts; give --opt api=pytorchjob to set it",
    "backoff_limit": "the runtime's Job template decides retries; use --opt max_restarts=N (torchrun) instead",
    "image_pull_policy": "runtimePatches cannot change the node container's pull policy; use a new image tag",
}


def trainjob_name(name: str) -> str:
    """``--name`` as an RFC 1035 label of at most 63 characters; refused when nothing of it survives."""
    safe = re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]+", "-", name.lower())).strip("-")
    if not re.search(r"[a-z0-9]", safe):
        raise SpecError(
            f"--name {name[:60]!r} has no letter or digit a TrainJob name (RFC 1035 label) could keep",
            "give --name with lower-case letters, digits and '-', e.g. --name pi-run",
        )
    if not safe[0].isalpha():
        safe = "job-" + safe
    safe = safe[:63].rstrip("-")
    assert _RFC1035.fullmatch(safe), safe
    return safe


def quantity(text: str, source: str) -> str:
    """``32G`` -> ``32Gi``: Kubernetes binary quantities (our sizes are binary, like Slurm's)."""
    n = parse_size(text, source)
    units = (("Ti", 1024**4), ("Gi", 1024**3), ("Mi", 1024**2), ("Ki", 1024))
    return next((f"{n // f}{unit}" for unit, f in units if n >= f and n % f == 0), str(n))


def resources(spec: JobSpec, opts: Mapping[str, str]) -> dict[str, Any]:
    """Per-pod limits: GPUs, CPUs (per process x processes), memory, rdma and extended resources."""
    limits: dict[str, Any] = {}
    if spec.gpus_per_node:
        limits["amd.com/gpu" if spec.gpu_kind == "amd" else "nvidia.com/gpu"] = spec.gpus_per_node
    if opts.get("rdma"):
        res, _, count = opts.get("rdma_resource", "rdma/rdma=1").partition("=")
        limits[res] = int(count) if count.isdigit() else 1
    for res, count in pairs(opts, "extended_resource"):
        limits[res] = int(count) if count.isdigit() else count
    if spec.cpus_per_task:
        limits["cpu"] = spec.cpus_per_task * spec.nproc_per_node
    elif spec.cpus_per_gpu and spec.gpus_per_node:
        limits["cpu"] = spec.cpus_per_gpu * spec.gpus_per_node
    if spec.mem:
        limits["memory"] = quantity(spec.mem, "--mem")
    return limits


def tolerations(opts: Mapping[str, str]) -> list[dict[str, str]]:
    """``--opt toleration=KEY[=VALUE][:EFFECT],...``: ``Equal`` with a value, ``Exists`` without."""
    out = []
    for item in (opts.get("toleration") or "").split(","):
        if not item.strip():
            continue
        body, _, effect = item.strip().partition(":")
        key, sep, value = body.partition("=")
        if not key or (effect and effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute")):
            raise SpecError(
                f"toleration {item!r} (from --opt toleration=...) is not KEY[=VALUE][:EFFECT]",
                "e.g. --opt toleration=nvidia.com/gpu:NoSchedule (EFFECT: NoSchedule, PreferNoSchedule, NoExecute)",
            )
        tol = {"key": key, "operator": "Equal" if sep else "Exists"}
        if sep:
            tol["value"] = value
        if effect:
            tol["effect"] = effect
        out.append(tol)
    return out


def pod_script(spec: JobSpec, python: str, opts: Mapping[str, str]) -> str:
    """``bash -c`` text for the ``node`` container: torchrun from the controller's ``PET_*`` variables.

    torchrun would read ``PET_*`` by itself; writing them as flags makes the
    command say what it does (and ``--nnodes`` is fixed at render time). The
    script's own arguments arrive as ``"$@"``, never parsed by a shell.
    """
    argv = pod_torchrun(spec, python, '"$PET_NODE_RANK"')
    argv[argv.index("--master-addr") + 1] = Raw('"$PET_MASTER_ADDR"')
    argv[argv.index("--master-port") + 1] = Raw('"$PET_MASTER_PORT"')
    lines: list[str] = []
    workdir = opts.get("workdir") or (spec.container.workdir if spec.container else None)
    if workdir:
        lines.append(join(["cd", workdir]))  # runtimePatches cannot set the node container's workingDir
    lines += list(spec.setup)
    if spec.network and wants_auto(spec.network):
        lines += [ln for ln in auto_lines(python, "PET_MASTER_ADDR") if not ln.startswith("#")]
    lines += wrap_command("exec " + join([*argv, Raw('"$@"')]), indent="")  # a manifest line a person can read
    # The exit cures (launchers/boot.py): the boot ConfigMap first on PYTHONPATH, torchrun's workers inherit it.
    return bootmap.pod_lines(opts) + "\n".join(lines)


def lead(spec: JobSpec) -> tuple[str, ...]:
    """A leading "--" of the program's arguments, which stays in the pod's text: torchrun would drop it from "$@"."""
    return ("--",) if spec.entrypoint.args[:1] == ("--",) else ()


def pod_torchrun(spec: JobSpec, python: str, node_rank: str) -> list[str]:
    """torchrun in one pod of ``spec.nodes`` (TrainJob, PyTorchJob), its node rank the shell words ``node_rank``;
    the program's arguments are left to ``"$@"``, all but a :func:`lead`."""
    bare = spec.with_(entrypoint=replace(spec.entrypoint, args=lead(spec)))
    return torchrun_argv(bare, python, nnodes=str(spec.nodes), rdzv_id="", endpoint="", node_rank=Raw(node_rank),
                         extra=["--tee", "3"])


def pod_volumes(spec: JobSpec, opts: Mapping[str, str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, the container's volumeMounts): a memory-backed /dev/shm, the PVCs, the boot ConfigMap."""
    shm: dict[str, Any] = {"medium": "Memory"}
    if opts.get("shm_size"):
        shm["sizeLimit"] = quantity(opts["shm_size"], "shm_size (from --opt)")
    volumes: list[dict[str, Any]] = [{"name": "dshm", "emptyDir": shm}]
    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    for i, c in enumerate(volume_claims(spec, opts)):
        claim: dict[str, Any] = {"claimName": c.claim}
        mount: dict[str, Any] = {"name": f"pvc-{i}", "mountPath": c.path}
        if c.read_only:
            claim["readOnly"] = mount["readOnly"] = True
        volumes.append({"name": f"pvc-{i}", "persistentVolumeClaim": claim})
        mounts.append(mount)
    bootmap.add_mount(opts, volumes, mounts)
    return volumes, mounts


def pod_template(pod_spec: dict[str, Any], opts: Mapping[str, str]) -> dict[str, Any]:
    """The pod template: ``pod_spec``, with the annotations (``--opt annotation``, ``rdma``) when there are any."""
    annotations = dict(pairs(opts, "annotation"))
    if opts.get("rdma"):
        annotations[RDMA_ANNOTATION] = opts["rdma"]
    if annotations:
        return {"metadata": {"annotations": annotations}, "spec": pod_spec}
    return {"spec": pod_spec}


def job_labels(opts: Mapping[str, str]) -> dict[str, str]:
    labels = {"app.kubernetes.io/managed-by": "torchhpc"}
    if opts.get("queue"):
        labels[QUEUE_LABEL] = opts["queue"]
    return labels


def check_env(spec: JobSpec) -> None:
    """User variables named ``PET_*`` are refused: the controller owns that prefix (its webhook rejects five)."""
    for name, _ in spec.env:
        if name.startswith("PET_"):
            raise SpecError(
                f"--env {name}: PET_* variables belong to the Kubeflow Trainer controller (it sets "
                f"{', '.join(RESERVED_ENV)} per node and torchrun reads PET_* as its own flags)",
                "drop it; set the geometry with --nodes/--nproc-per-node, or a torchrun flag through the program",
            )


def trainjob(spec: JobSpec, image: str, namespace: str, opts: Mapping[str, str]) -> dict[str, Any]:
    """The TrainJob object, as plain data (YAML for kubectl, JSON for the API)."""
    for key, why in REFUSED.items():
        if key in opts:
            raise SpecError(f"--opt {key}={opts[key]} has no TrainJob field", why)
    if spec.requeue or spec.signal_before:
        raise SpecError(
            "--requeue/--signal-before have no TrainJob equivalent (a TrainJob past its deadline fails)",
            "drop them, or checkpoint on a schedule inside the program",
        )
    if spec.container and spec.container.env:
        raise SpecError(
            f"--container-env {spec.container.env[0]}: a pod inherits nothing from this machine",
            "pass the value itself: --env NAME=VALUE",
        )
    check_env(spec)
    if spec.max_restarts and opts.get("runtime"):
        raise SpecError(
            f"--max-restarts {spec.max_restarts} with --opt runtime={opts['runtime']}: the restarts live in a runtime "
            "torchhpc renders (its JobSet failure policy), which replaces yours",
            "drop --opt runtime, or drop --max-restarts and give your runtime a failurePolicy",
        )
    python = spec.entrypoint.python or "python"
    trainer: dict[str, Any] = {
        "image": image,
        "command": ["bash", "-c", pod_script(spec, python, opts), "torchhpc-pod", *spec.entrypoint.args[len(lead(spec)):]],
    }
    if spec.env:
        trainer["env"] = [{"name": k, "value": v} for k, v in spec.env]
    trainer["numNodes"] = spec.nodes
    # Always: unset, a CPU job would start one process per requested CPU.
    trainer["numProcPerNode"] = spec.nproc_per_node
    limits = resources(spec, opts)
    if limits:
        trainer["resourcesPerNode"] = {"limits": limits, "requests": dict(limits)}

    volumes, mounts = pod_volumes(spec, opts)
    pod_spec: dict[str, Any] = {}
    if opts.get("node_selector"):
        pod_spec["nodeSelector"] = dict(pairs(opts, "node_selector"))
    if opts.get("toleration"):
        pod_spec["tolerations"] = tolerations(opts)
    if opts.get("service_account"):
        pod_spec["serviceAccountName"] = opts["service_account"]
    pod_spec["volumes"] = volumes
    pod_spec["containers"] = [{"name": NODE, "volumeMounts": mounts}]
    patch = {"manager": MANAGER, "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
        {"name": NODE, "template": {"spec": {"template": pod_template(pod_spec, opts)}}}]}}}}

    ref: dict[str, Any] = {"name": opts.get("runtime") or DEFAULT_RUNTIME}
    if spec.max_restarts:  # our own runtime, rendered beside it (schedulers/kubernetes/runtime.py)
        ref = {"name": runtime_name(trainjob_name(spec.name)), "apiGroup": "trainer.kubeflow.org", "kind": RUNTIME_KIND}
    body: dict[str, Any] = {"runtimeRef": ref}
    if spec.time_seconds:
        body["activeDeadlineSeconds"] = spec.time_seconds
    body["trainer"] = trainer
    body["runtimePatches"] = [patch]
    return {
        "apiVersion": API_VERSION,
        "kind": "TrainJob",
        "metadata": {"name": trainjob_name(spec.name), "namespace": namespace, "labels": job_labels(opts)},
        "spec": body,
    }


def status_from_trainjob(job_id: str, obj: Mapping[str, Any]) -> JobStatus:
    """A TrainJob's ``status`` -> our states.

    Conditions are kept by type (not appended): ``Failed`` (reason
    ``DeadlineExceeded`` when ``activeDeadlineSeconds`` ran out: TIMEOUT),
    ``Complete``, ``Suspended`` (Kueue holds it). Without any, the JobSet's
    ``jobsStatus`` says whether pods are active (RUNNING) or not yet (PENDING).
    """
    status = obj.get("status") or {}
    true = {str(c.get("type")): c for c in status.get("conditions") or [] if str(c.get("status")) == "True"}
    state, reason = "PENDING", ""
    if "Failed" in true:
        cond = true["Failed"]
        state = "TIMEOUT" if cond.get("reason") == "DeadlineExceeded" else "FAILED"
        reason = str(cond.get("reason") or "") + (f": {cond['message']}" if cond.get("message") else "")
    elif "Complete" in true:
        state = "COMPLETED"
    elif "Suspended" in true:
        state, reason = "SUSPENDED", str(true["Suspended"].get("message") or "suspended (e.g. waiting in a Kueue queue)")
    elif any(int(j.get("active") or 0) + int(j.get("ready") or 0) for j in status.get("jobsStatus") or []):
        state = "RUNNING"
    name = (obj.get("metadata") or {}).get("name", job_id)
    return JobStatus(
        job_id=job_id,
        state=state,
        exit_code=0 if state == "COMPLETED" else (1 if state in ("FAILED", "TIMEOUT") else None),
        reason=reason,
        name=name,
        raw={"conditions": ",".join(sorted(true))},
    )
