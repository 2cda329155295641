"""The Kubernetes backend: a Kubeflow ``PyTorchJob`` (training-operator, ``kubeflow.org/v1``).

One Master pod plus ``nodes - 1`` Worker pods; each pod runs torchrun once with
``--nproc-per-node`` processes. The operator sets ``MASTER_ADDR``/``MASTER_PORT``
and, per pod, ``RANK`` (the pod's index; newer operators also ``PET_NODE_RANK``).
Its ``WORLD_SIZE`` counts pods in older releases and processes in newer ones,
so we never read it: ``--nnodes`` is written in at render time.

The manifest is emitted as YAML by a tiny deterministic emitter (PyYAML is not a
runtime dependency). ``submit`` pipes it to ``kubectl apply -f -`` when kubectl
exists, else POSTs it (as JSON) to the API server with a bearer token through
the standard library -- the ``kubernetes`` Python package is never required.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from torchhpc.core.shell import Raw, join
from torchhpc.core.spec import JobSpec
from torchhpc.core.units import parse_size
from torchhpc.core.validate import check_dns_label
from torchhpc.errors import CommandError, SchedulerError, SpecError
from torchhpc.launchers import get_launcher, torchrun_argv
from torchhpc.launchers.boot import boot_shell
from torchhpc.network.presets import auto_lines, wants_auto
from torchhpc.schedulers.api import JobStatus, Scheduler, Submission
from torchhpc.schedulers.kube_io import KubeAPI, to_yaml
from torchhpc.schedulers.options import Option, declare
from torchhpc.schedulers.pods import RDMA_ANNOTATION, k8s_name, normalized_options
from torchhpc.schedulers.script import load_record, save_record

__all__ = ["GROUP_PATH", "KubeAPI", "KubernetesScheduler", "manifest", "status_from_job", "to_yaml"]

GROUP_PATH = "/apis/kubeflow.org/v1"
CONTAINER = "pytorch"  # the operator finds the training container by this name
PORT_NAME, PORT = "pytorchjob-port", 23456  # the operator's defaults, written out


# --- the manifest --------------------------------------------------------------------


def _quantity(text: str) -> str:
    """``32G`` -> ``32Gi``: Kubernetes binary quantities (our sizes are binary, like Slurm's)."""
    n = parse_size(text, "--mem")
    for unit, f in (("Ti", 1024**4), ("Gi", 1024**3), ("Mi", 1024**2), ("Ki", 1024)):
        if n >= f and n % f == 0:
            return f"{n // f}{unit}"
    return str(n)


def pod_script(spec: JobSpec, python: str) -> str:
    """``bash -c`` text: torchrun over pods. The script's own arguments arrive as ``"$@"``,
    so they are never parsed by a shell."""
    # A leading "--" of the program stays in the text: torchrun would drop it from "$@".
    bare = spec.with_(entrypoint=replace(spec.entrypoint, args=_lead(spec)))
    argv = torchrun_argv(
        bare,
        python,
        nnodes=str(spec.nodes),
        rdzv_id="",
        endpoint="",
        node_rank=Raw('"${PET_NODE_RANK:-$RANK}"'),
        extra=["--tee", "3"],
    )
    start = ""
    if spec.network and wants_auto(spec.network):
        # --network auto at pod start: NCCL_IB_GID_INDEX, NCCL_IB_HCA... from this pod's sysfs.
        start = "; ".join(ln for ln in auto_lines(python) if not ln.startswith("#")) + "; "
    # The exit cures (launchers/boot.py): the pod's shell writes the boot directory, torchrun's workers inherit it.
    return boot_shell() + start + "exec " + join([*argv, Raw('"$@"')])


def _lead(spec: JobSpec) -> tuple[str, ...]:
    return ("--",) if spec.entrypoint.args[:1] == ("--",) else ()


def _pvcs(spec: JobSpec) -> list[tuple[str, str]]:
    out = []
    for item in (spec.option("pvc") or "").split(","):
        if not item.strip():
            continue
        claim, sep, path = item.strip().partition(":")
        if not sep or not claim or not path.startswith("/"):
            raise SpecError(f"pvc {item!r} (from --opt pvc=...) is not CLAIM:/mount/path")
        out.append((claim, path))
    return out


def _pairs(opts: Mapping[str, str], key: str) -> list[tuple[str, str]]:
    out = []
    for item in (opts.get(key) or "").split(","):
        if item.strip():
            name, sep, value = item.strip().partition("=")
            if not sep or not name:
                raise SpecError(f"{key} {item!r} (from --opt {key}=...) is not NAME=VALUE")
            out.append((name, value))
    return out


def manifest(spec: JobSpec, image: str, namespace: str) -> dict[str, Any]:
    """The PyTorchJob object, as plain data (the same dict is YAML for kubectl and JSON for the API)."""
    opts = normalized_options(spec)
    spec = spec.with_(options=tuple(opts.items()))
    if spec.entrypoint.kind != "script":
        raise SpecError(
            "the kubernetes scheduler runs a Python script in each pod",
            "give train.py (a path inside the image or on a mounted PVC)",
        )
    python = spec.entrypoint.python or "python"
    limits: dict[str, Any] = {}
    if spec.gpus_per_node:
        limits["amd.com/gpu" if spec.gpu_kind == "amd" else "nvidia.com/gpu"] = spec.gpus_per_node
    if opts.get("rdma"):
        res, _, count = opts.get("rdma_resource", "rdma/rdma=1").partition("=")
        limits[res] = int(count) if count.isdigit() else 1
    for res, count in _pairs(opts, "extended_resource"):
        limits[res] = int(count) if count.isdigit() else count
    if spec.cpus_per_task:
        limits["cpu"] = spec.cpus_per_task * spec.nproc_per_node
    if spec.mem:
        limits["memory"] = _quantity(spec.mem)
    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    shm: dict[str, Any] = {"medium": "Memory"}
    if opts.get("shm_size"):
        shm["sizeLimit"] = _quantity(opts["shm_size"])
    volumes: list[dict[str, Any]] = [{"name": "dshm", "emptyDir": shm}]
    for i, (claim, path) in enumerate(_pvcs(spec)):
        mounts.append({"name": f"pvc-{i}", "mountPath": path})
        volumes.append({"name": f"pvc-{i}", "persistentVolumeClaim": {"claimName": claim}})
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": image,
        "imagePullPolicy": opts.get("image_pull_policy", "IfNotPresent"),
        "command": ["bash", "-c", pod_script(spec, python), "torchhpc-pod", *spec.entrypoint.args[len(_lead(spec)):]],
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
    annotations = dict(_pairs(opts, "annotation"))
    if opts.get("rdma"):
        annotations[RDMA_ANNOTATION] = opts["rdma"]
    template: dict[str, Any] = {"spec": pod_spec}
    if annotations:
        template = {"metadata": {"annotations": annotations}, "spec": pod_spec}
    restart = opts.get("restart_policy", "Never")
    replicas: dict[str, Any] = {"Master": {"replicas": 1, "restartPolicy": restart, "template": template}}
    if spec.nodes > 1:
        replicas["Worker"] = {"replicas": spec.nodes - 1, "restartPolicy": restart, "template": template}
    run_policy: dict[str, Any] = {"cleanPodPolicy": "None", "backoffLimit": int(opts.get("backoff_limit", "0"))}
    if spec.time_seconds:
        run_policy["activeDeadlineSeconds"] = spec.time_seconds
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {
            "name": k8s_name(spec.name),
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": "torchhpc"},
        },
        "spec": {
            "nprocPerNode": str(spec.nproc_per_node),
            "runPolicy": run_policy,
            "pytorchReplicaSpecs": replicas,
        },
    }


def _job_name(name: str) -> str:
    """A PyTorchJob name as it may appear in an API path (DNS-1123 subdomain characters only)."""
    if not re.fullmatch(r"[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?", name):
        raise SpecError(f"kubernetes job {name[:60]!r} is not a PyTorchJob name", "give NAMESPACE/NAME or NAME, e.g. default/pi")
    return name


# --- the scheduler ------------------------------------------------------------------------


class KubernetesScheduler(Scheduler):
    name = "kubernetes"
    submit_command = "kubectl"
    OPTIONS = declare(
        Option("image", "container image every pod runs; or give --container IMAGE"),
        Option("namespace", "namespace of the PyTorchJob", default="default"),
        Option("pvc", "PVC mounts, comma separated CLAIM:/mount/path"),
        Option("rdma", "RDMA network attachment (pod annotation k8s.v1.cni.cncf.io/networks), e.g. kube-system/roce"),
        Option("rdma_resource", "extended resource requested with rdma", default="rdma/rdma=1"),
        Option("annotation", "extra pod annotations, comma separated KEY=VALUE"),
        Option("extended_resource", "extra extended resources (limits), comma separated NAME=COUNT"),
        Option("large_shm", "accepted for RunAI profiles; the memory-backed /dev/shm is always mounted", "bool"),
        Option("shm_size", "size limit of the memory-backed /dev/shm (default: unlimited within the pod)"),
        Option("workdir", "container working directory"),
        Option("restart_policy", "pod restart policy", "choice", "Never", ("Never", "OnFailure", "Always", "ExitCode")),
        Option("backoff_limit", "retries before the job is marked failed", "int", "0"),
        Option("image_pull_policy", "image pull policy", "choice", "IfNotPresent", ("IfNotPresent", "Always", "Never")),
        Option("service_account", "pod service account name"),
        Option("max_restarts", "torchrun --max-restarts (0: fail fast)", "int", "0"),
        Option("transport", "auto: kubectl if installed, else the API", "choice", "auto", ("auto", "kubectl", "api")),
        Option("api_server", "API server URL for the 'api' transport, e.g. https://HOST:6443"),
        Option("token_file", "file holding the bearer token for the 'api' transport"),
        Option("ca_file", "CA bundle for the API server's certificate"),
    )

    def _check(self, spec: JobSpec) -> dict[str, str]:
        opts = self.checked_options(spec, normalized_options(spec))
        get_launcher(spec.launcher).check(self.name)
        # The namespace is part of every API path: a DNS-1123 label, nothing else (no '/', '..', '?').
        check_dns_label(opts.get("namespace", "default"), "namespace (from --opt namespace=...)")
        return opts

    def render(self, spec: JobSpec) -> Submission:
        from torchhpc.core.array import refuse_array

        refuse_array(self.name, spec.array)
        opts = self._check(spec)
        image = opts.get("image") or (spec.container.image if spec.container else "")
        if not image:
            raise SpecError("the kubernetes scheduler needs a container image", "add --image REGISTRY/IMAGE:TAG")
        obj = manifest(spec, image, opts.get("namespace", "default"))
        text = to_yaml(obj)
        path = os.path.join(os.path.abspath(spec.output_dir), f"{obj['metadata']['name']}.pytorchjob.yaml")
        return Submission(
            scheduler=self.name,
            spec=spec,
            argv=("kubectl", "apply", "-f", "-"),
            script=text,
            script_path=path,
            files=((path, text),),
            stdin=text,
            notes=(f"{spec.nodes} pods (1 Master + {spec.nodes - 1} Worker) x {spec.nproc_per_node} processes",),
        )

    # talking to Kubernetes ----------------------------------------------------------------
    def _use_kubectl(self, opts: Mapping[str, str]) -> bool:
        transport = opts.get("transport", "auto")
        if transport not in ("auto", "kubectl", "api"):
            raise SpecError(f"transport={transport!r} (from --opt) is not auto, kubectl or api")
        return transport == "kubectl" or (transport == "auto" and self.runner.which("kubectl") is not None)

    def _locate(self, job_id: str) -> tuple[str, str, dict[str, object]]:
        """``ns/name`` or ``name`` (namespace from our record, else 'default')."""
        if "/" in job_id:
            ns, name = job_id.split("/", 1)
            rec = load_record(self.name, _job_name(name))
        else:
            name, rec = job_id, load_record(self.name, _job_name(job_id))
            ns = str(rec.get("namespace") or "default")
        return check_dns_label(ns, "namespace (from the job id)"), name, rec

    def _api(self, rec: Mapping[str, object]) -> KubeAPI | None:
        raw = rec.get("options")
        opts = {str(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}
        return None if self._use_kubectl(opts) else KubeAPI.from_options(opts)

    def schedule(self, submission: Submission) -> str:
        spec = submission.spec
        opts = normalized_options(spec)
        submission.write_files()
        obj = manifest(spec, opts.get("image") or (spec.container.image if spec.container else ""),
                       opts.get("namespace", "default"))
        ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        if self._use_kubectl(opts):
            self.runner.run(list(submission.argv), input=submission.stdin,
                            hint="`kubectl get crd pytorchjobs.kubeflow.org` checks the training-operator")
        else:
            KubeAPI.from_options(opts).request("POST", f"{GROUP_PATH}/namespaces/{ns}/pytorchjobs", obj)
        keep = {k: v for k, v in opts.items() if k in ("transport", "api_server", "token_file", "ca_file")}
        save_record(self.name, name, namespace=ns, nodes=spec.nodes,
                    nproc_per_node=spec.nproc_per_node, options=keep)
        return name

    def get(self, job_id: str) -> dict[str, Any]:
        ns, name, rec = self._locate(job_id)
        api = self._api(rec)
        if api is None:
            try:
                done = self.runner.run(["kubectl", "get", "pytorchjob", name, "-n", ns, "-o", "json"], timeout=60)
            except CommandError as e:
                if "NotFound" in e.stderr or "not found" in e.stderr:
                    raise SchedulerError(f"PyTorchJob {ns}/{name} not found", "`kubectl get pytorchjobs -A`") from None
                raise
            text = done.stdout
        else:
            text = api.request("GET", f"{GROUP_PATH}/namespaces/{ns}/pytorchjobs/{name}")[1]
        data: dict[str, Any] = json.loads(text)
        return data

    def status(self, job_id: str) -> JobStatus:
        return status_from_job(job_id, self.get(job_id))

    def cancel(self, job_id: str) -> None:
        ns, name, rec = self._locate(job_id)
        api = self._api(rec)
        if api is None:
            self.runner.run(["kubectl", "delete", "pytorchjob", name, "-n", ns])
        else:
            api.request("DELETE", f"{GROUP_PATH}/namespaces/{ns}/pytorchjobs/{name}")

    def pods(self, job_id: str) -> list[str]:
        """Pod names as the operator makes them: ``NAME-master-0``, ``NAME-worker-I``."""
        _, name, rec = self._locate(job_id)
        nodes = int(str(rec.get("nodes") or 1))
        return [f"{name}-master-0", *(f"{name}-worker-{i}" for i in range(nodes - 1))]

    def logs(self, job_id: str, rank: int | None = None) -> str:
        ns, _, rec = self._locate(job_id)
        pods = self.pods(job_id)
        if rank is not None:
            node = rank // max(1, int(str(rec.get("nproc_per_node") or 1)))
            if node >= len(pods):
                raise SchedulerError(f"rank {rank} is not in job {job_id} ({len(pods)} pods)")
            pods = [pods[node]]
        api = self._api(rec)
        parts = []
        for pod in pods:
            if api is None:
                text = self.runner.run(["kubectl", "logs", pod, "-n", ns, "-c", CONTAINER], timeout=120).stdout
            else:
                text = api.request("GET", f"/api/v1/namespaces/{ns}/pods/{pod}/log?container={CONTAINER}")[1]
            parts.append(text if len(pods) == 1 else f"==> {pod} <==\n{text}")
        return "".join(parts)


def status_from_job(job_id: str, obj: Mapping[str, Any]) -> JobStatus:
    """A PyTorchJob's ``status.conditions`` -> our states.

    The operator appends conditions (Created, Running, Restarting, Succeeded,
    Failed, Suspended); the last one whose status is "True" is the job's state.
    """
    status = obj.get("status") or {}
    state, reason = "PENDING", ""
    for cond in status.get("conditions") or []:
        if str(cond.get("status")) != "True":
            continue
        kind = cond.get("type", "")
        reason = cond.get("message") or cond.get("reason") or ""
        state = {
            "Created": "PENDING",
            "Running": "RUNNING",
            "Restarting": "RUNNING",
            "Succeeded": "COMPLETED",
            "Failed": "FAILED",
            "Suspended": "SUSPENDED",
        }.get(kind, state)
    restarts = sum(1 for c in status.get("conditions") or [] if c.get("type") == "Restarting")
    name = (obj.get("metadata") or {}).get("name", job_id)
    return JobStatus(
        job_id=job_id,
        state=state,
        exit_code=0 if state == "COMPLETED" else (1 if state == "FAILED" else None),
        reason=reason if state != "COMPLETED" else "",
        name=name,
        restarts=restarts,
        raw={"startTime": str(status.get("startTime", "")), "completionTime": str(status.get("completionTime", ""))},
    )
