"""The Kubernetes backend: a Kubeflow Trainer v2 ``TrainJob`` by default, a ``PyTorchJob`` on request.

``--opt api=trainjob`` (the default; :mod:`torchhpc.schedulers.kubernetes.trainjob`)
renders ``trainer.kubeflow.org/v1alpha1``. ``--opt api=pytorchjob`` keeps the
training-operator v1 render (``kubeflow.org/v1``, :mod:`torchhpc.schedulers.kubernetes.pytorchjob`)
for clusters that still run it.

The manifest is emitted as YAML by a tiny deterministic emitter (PyYAML is not a
runtime dependency). ``submit`` pipes it to ``kubectl apply -f -`` when kubectl
exists, else POSTs it (as JSON) to the API server with a bearer token through
the standard library -- the ``kubernetes`` Python package is never required.
"""

from __future__ import annotations

import json
import os
import re
import urllib.parse
from collections.abc import Mapping
from typing import Any

from torchhpc.core.spec import JobSpec
from torchhpc.core.units import counted
from torchhpc.core.validate import check_dns_label
from torchhpc.errors import CommandError, SchedulerError, SpecError, UnknownJob
from torchhpc.jobdir.record import JobRecord, new_record, read_record, record_dir, save_record
from torchhpc.launchers import get_launcher
from torchhpc.schedulers.api import JobStatus, Scheduler, Submission
from torchhpc.schedulers.kubernetes import bootmap
from torchhpc.schedulers.kubernetes import trainjob as tj
from torchhpc.schedulers.kubernetes.pods import normalized_options
from torchhpc.schedulers.kubernetes.pytorchjob import CONTAINER, GROUP_PATH, manifest
from torchhpc.schedulers.kubernetes.rest import KubeAPI
from torchhpc.schedulers.kubernetes.runtime import restart_note, training_runtime
from torchhpc.schedulers.kubernetes.yaml_text import to_yaml
from torchhpc.schedulers.options import Option, declare

__all__ = ["GROUP_PATH", "KubeAPI", "KubernetesScheduler", "manifest", "status_from_job", "to_yaml"]


# Per API: (kubectl resource, API group path, plural, container to read logs from, how to check the cluster has it).
APIS: dict[str, tuple[str, str, str, str, str]] = {
    "trainjob": (tj.CRD, tj.GROUP_PATH, "trainjobs", "node",
                 f"`kubectl get crd {tj.CRD}` and `kubectl get clustertrainingruntimes` (Kubeflow Trainer v2)"),
    "pytorchjob": ("pytorchjobs.kubeflow.org", GROUP_PATH, "pytorchjobs", CONTAINER,
                   "`kubectl get crd pytorchjobs.kubeflow.org` (Kubeflow training-operator v1)"),
}


def _job_name(name: str) -> str:
    """A job name as it may appear in an API path (DNS-1123 subdomain characters only)."""
    if not re.fullmatch(r"[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?", name):
        raise SpecError(f"kubernetes job {name[:60]!r} is not a TrainJob/PyTorchJob name", "give NAMESPACE/NAME or NAME, e.g. default/pi")
    return name


# --- the scheduler ------------------------------------------------------------------------


class KubernetesScheduler(Scheduler):
    name = "kubernetes"
    submit_command = "kubectl"
    # capabilities (schedulers/capabilities.py): a deadline (activeDeadlineSeconds), no arrays, the cluster's runtime.
    # A TrainJob maps --bind CLAIM:/path to a PVC and runs setup lines in the pod (trainjob.py refuses the rest);
    # the PyTorchJob render does neither, and _check refuses them there.
    supports_cpus_per_gpu = False
    supports_container_options = True
    supports_setup = True
    supports_restarts = True  # PyTorchJob runPolicy.backoffLimit; a TrainJob: its own runtime's JobSet failurePolicy
    supports_dependencies = False  # no Job dependency in the Kubeflow APIs: refused (docs/capabilities.md)
    runs_in_pods = True
    OPTIONS = declare(
        Option("api", "what to render: a Kubeflow Trainer v2 TrainJob, or a training-operator v1 PyTorchJob",
               "choice", "trainjob", ("trainjob", "pytorchjob")),
        Option("runtime", "TrainJob: the ClusterTrainingRuntime to run (runtimeRef)", default=tj.DEFAULT_RUNTIME),
        Option("image", "container image every pod runs; or give --container IMAGE"),
        Option("namespace", "namespace of the job", default="default"),
        Option("queue", "Kueue LocalQueue (label kueue.x-k8s.io/queue-name); or give --queue NAME"),
        Option("pvc", "PVC mounts, comma separated CLAIM:/mount/path[:ro] (as --bind CLAIM:/mount/path)"),
        Option("bind", "PVC mounts given as --bind without --container (CLAIM:/mount/path[:ro], comma separated)"),
        Option("rdma", "RDMA network attachment (pod annotation k8s.v1.cni.cncf.io/networks), e.g. kube-system/roce"),
        Option("rdma_resource", "extended resource requested with rdma", default="rdma/rdma=1"),
        Option("annotation", "extra pod annotations, comma separated KEY=VALUE"),
        Option("extended_resource", "extra extended resources (limits), comma separated NAME=COUNT"),
        Option("node_selector", "pod nodeSelector, comma separated KEY=VALUE"),
        Option("toleration", "pod tolerations, comma separated KEY[=VALUE][:EFFECT]"),
        Option("large_shm", "accepted for RunAI profiles; the memory-backed /dev/shm is always mounted", "bool"),
        Option("shm_size", "size limit of the memory-backed /dev/shm (default: unlimited within the pod)"),
        Option("workdir", "container working directory (TrainJob: a cd before torchrun)"),
        Option("restart_policy", "PyTorchJob pod restart policy", "choice", "Never", ("Never", "OnFailure", "Always", "ExitCode")),
        Option("backoff_limit", "PyTorchJob: retries before the job is marked failed", "int", "0"),
        Option("image_pull_policy", "PyTorchJob: image pull policy", "choice", "IfNotPresent", ("IfNotPresent", "Always", "Never")),
        Option("service_account", "pod service account name"),
        Option("max_restarts", "torchrun --max-restarts (0: fail fast)", "int", "0"),
        Option("transport", "auto: kubectl if installed, else the API", "choice", "auto", ("auto", "kubectl", "api")),
        Option("boot", "the boot file in pods: a ConfigMap made at submit if absent (falls back to inline where it "
               "cannot be made), or inline in the pod command", "choice", "configmap", ("configmap", "inline")),
        Option("api_server", "API server URL for the 'api' transport, e.g. https://HOST:6443"),
        Option("token_file", "file holding the bearer token for the 'api' transport"),
        Option("ca_file", "CA bundle for the API server's certificate"),
    )

    def _check(self, spec: JobSpec) -> dict[str, str]:
        opts = self.checked_options(spec, normalized_options(spec))
        if opts.get("api", "trainjob") == "trainjob" and spec.launcher != "torchrun":
            raise SpecError(
                f"--launcher {spec.launcher}: a TrainJob's torch runtime starts torchrun in each pod, nothing else",
                "drop --launcher (torchrun is the default), or use --scheduler slurm/pbs for srun/mpirun",
            )
        if opts.get("api", "trainjob") == "pytorchjob":
            c = spec.container
            if spec.setup or (c is not None and (c.binds or c.env or c.cleanenv)):
                raise SpecError(
                    "setup lines and --bind/--container-env/--cleanenv are not rendered into a PyTorchJob",
                    "drop them, or use the default TrainJob render (it maps --bind CLAIM:/path and setup lines)",
                )
        get_launcher(spec.launcher).check(self.name)
        # The namespace is part of every API path: a DNS-1123 label, nothing else (no '/', '..', '?').
        check_dns_label(opts.get("namespace", "default"), "namespace (from --opt namespace=...)")
        if spec.entrypoint.kind != "script":
            raise SpecError(
                "the kubernetes scheduler runs a Python script in each pod",
                "give train.py (a path inside the image or on a mounted PVC)",
            )
        return opts

    def _image(self, spec: JobSpec, opts: Mapping[str, str]) -> str:
        image = opts.get("image") or (spec.container.image if spec.container else "")
        if not image:
            raise SpecError("the kubernetes scheduler needs a container image", "add --image REGISTRY/IMAGE:TAG")
        return str(image)

    def build(self, spec: JobSpec) -> tuple[str, dict[str, Any]]:
        """(api, object) for the job: what render prints and schedule sends."""
        opts = self._check(spec)
        api, image, ns = opts.get("api", "trainjob"), self._image(spec, opts), opts.get("namespace", "default")
        if api == "pytorchjob":
            if "runtime" in opts:
                raise SpecError(f"--opt runtime={opts['runtime']}: a PyTorchJob has no training runtime",
                                "drop it, or drop --opt api=pytorchjob to render a TrainJob")
            return api, manifest(spec, image, ns)
        return api, tj.trainjob(spec, image, ns, opts)

    def _render(self, spec: JobSpec) -> Submission:
        from torchhpc.core.array import refuse_array

        refuse_array(self.name, spec.array)
        api, obj = self.build(spec)
        runtime = self.runtime(spec, api, obj)
        text = (to_yaml(runtime) + "---\n" if runtime else "") + to_yaml(obj)
        path = os.path.join(os.path.abspath(spec.output_dir), f"{obj['metadata']['name']}.{api}.yaml")
        if api == "pytorchjob":
            shape = f"{spec.nodes} pods (1 Master + {spec.nodes - 1} Worker) x {spec.nproc_per_node} processes"
        else:
            shape = (f"{counted(spec.nodes, 'node pod')} x {counted(spec.nproc_per_node, 'process', 'processes')} (runtime "
                     f"{obj['spec']['runtimeRef']['name']}): world size {spec.world_size}")
        return Submission(
            scheduler=self.name,
            spec=spec,
            argv=("kubectl", "apply", "-f", "-"),
            script=text,
            script_path=path,
            files=((path, text),),
            stdin=text,
            notes=(shape, f"targets {obj['apiVersion']} {obj['kind']}; check the cluster has it: {APIS[api][4]}",
                   *([] if bootmap.inline(normalized_options(spec)) else [
                       f"the pods mount ConfigMap {bootmap.map_name()} (the boot file), made at submit if absent; "
                       "where it cannot be, the job goes with the file inline (--opt boot=inline)"]),
                   *([restart_note(runtime)] if runtime else [])),
        )

    def runtime(self, spec: JobSpec, api: str, obj: dict[str, Any]) -> dict[str, Any] | None:
        """With --max-restarts, the TrainingRuntime the TrainJob names (schedulers/kubernetes/runtime.py)."""
        if api != "trainjob" or not spec.max_restarts:
            return None
        return training_runtime(obj["metadata"]["name"], obj["metadata"]["namespace"], obj["spec"]["trainer"]["image"],
                                spec.nodes, spec.max_restarts)

    # talking to Kubernetes ----------------------------------------------------------------
    def _use_kubectl(self, opts: Mapping[str, str]) -> bool:
        transport = opts.get("transport", "auto")
        if transport not in ("auto", "kubectl", "api"):
            raise SpecError(f"transport={transport!r} (from --opt) is not auto, kubectl or api")
        return transport == "kubectl" or (transport == "auto" and self.runner.which("kubectl") is not None)

    def _locate(self, job_id: str) -> tuple[str, str, JobRecord]:
        """``ns/name`` or ``name`` (namespace from our record, else 'default')."""
        if "/" in job_id:
            ns, name = job_id.split("/", 1)
            rec = read_record(self.name, _job_name(name))
        else:
            name, rec = job_id, read_record(self.name, _job_name(job_id))
            ns = rec.namespace or "default"
        return check_dns_label(ns, "namespace (from the job id)"), name, rec

    @staticmethod
    def _kind(rec: JobRecord) -> str:
        """The record's API; a record from before TrainJob (no 'api', but a namespace) is a PyTorchJob."""
        api = str(rec.extra.get("api") or ("pytorchjob" if rec.namespace else "trainjob"))
        return api if api in APIS else "trainjob"

    def _api(self, rec: JobRecord) -> KubeAPI | None:
        opts = rec.options
        return None if self._use_kubectl(opts) else KubeAPI.from_options(opts)

    def _read(self, api: KubeAPI | None, kubectl: list[str], path: str, timeout: float = 60,
              hint: str | None = None) -> str:
        """What ``kubectl KUBECTL...`` prints, or without kubectl (``api``) the API server's answer to GET ``path``."""
        if api is None:
            return self.runner.run(["kubectl", *kubectl], timeout=timeout, hint=hint).stdout
        return api.request("GET", path)[1]

    def schedule(self, submission: Submission) -> str:
        spec = submission.spec
        opts = normalized_options(spec)
        if not bootmap.inline(opts) and not self._boot_map(opts):  # no ConfigMap here: the file goes inline
            spec = spec.with_(options=(*spec.options, ("boot", "inline")))
            opts, submission = normalized_options(spec), self._render(spec)
        submission.write_files()
        api, obj = self.build(spec)
        _, group, plural, _, check = APIS[api]
        ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        if self._use_kubectl(opts):  # kubectl apply takes both documents, the runtime first
            self.runner.run(list(submission.argv), input=submission.stdin, hint=f"{check} shows whether it is installed")
        else:
            runtime = self.runtime(spec, api, obj)
            if runtime:
                KubeAPI.from_options(opts).request("POST", f"{group}/namespaces/{ns}/trainingruntimes", runtime)
            KubeAPI.from_options(opts).request("POST", f"{group}/namespaces/{ns}/{plural}", obj)
        keep = {k: v for k, v in opts.items() if k in ("transport", "api_server", "token_file", "ca_file")}
        save_record(new_record(self.name, name, namespace=ns, nodes=spec.nodes, api=api,
                    nproc_per_node=spec.nproc_per_node, options=keep))
        return name

    def _boot_map(self, opts: Mapping[str, str]) -> bool:
        """Create the boot ConfigMap in the job's namespace unless it exists (bootmap.py); False if it cannot be."""
        ns = opts.get("namespace", "default")
        if self._use_kubectl(opts):
            return bootmap.create(ns, lambda obj: self.runner.run(["kubectl", "create", "-f", "-"], input=to_yaml(obj)),
                                  None)
        return bootmap.create(ns, None, lambda path, obj: KubeAPI.from_options(opts).request("POST", path, obj))

    def get(self, job_id: str) -> dict[str, Any]:
        ns, name, rec = self._locate(job_id)
        resource, group, plural, _, _ = APIS[self._kind(rec)]
        try:
            text = self._read(self._api(rec), ["get", resource, name, "-n", ns, "-o", "json"],
                              f"{group}/namespaces/{ns}/{plural}/{name}")
        except CommandError as e:  # kubectl's (the API's errors are SchedulerErrors of their own)
            if "NotFound" in e.stderr or "not found" in e.stderr:
                raise UnknownJob(f"{resource} {ns}/{name} not found", f"`kubectl get {plural} -A`") from None
            raise
        data: dict[str, Any] = json.loads(text)
        return data

    def status(self, job_id: str) -> JobStatus:
        obj = self.get(job_id)
        if obj.get("kind") == "TrainJob" or str(obj.get("apiVersion", "")).startswith("trainer."):
            return tj.status_from_trainjob(job_id, obj)
        return status_from_job(job_id, obj)

    def cancel(self, job_id: str) -> None:
        ns, name, rec = self._locate(job_id)
        resource, group, plural, _, _ = APIS[self._kind(rec)]
        api = self._api(rec)
        if api is None:
            self.runner.run(["kubectl", "delete", resource, name, "-n", ns])
        else:
            api.request("DELETE", f"{group}/namespaces/{ns}/{plural}/{name}")

    def pods(self, job_id: str) -> list[str]:
        """The job's pods in node-rank order.

        PyTorchJob: named by the operator, ``NAME-master-0``, ``NAME-worker-I``.
        TrainJob: JobSet pods have random suffixes, so they are listed by the label
        ``jobset.sigs.k8s.io/jobset-name=NAME`` and ordered by the Job completion
        index (= ``PET_NODE_RANK``); of several tries of one index, the newest.
        """
        ns, name, rec = self._locate(job_id)
        if self._kind(rec) == "pytorchjob":
            return [f"{name}-master-0", *(f"{name}-worker-{i}" for i in range(rec.nodes - 1))]
        selector = f"{tj.JOBSET_LABEL}={name}"
        text = self._read(self._api(rec), ["get", "pods", "-n", ns, "-l", selector, "-o", "json"],
                          f"/api/v1/namespaces/{ns}/pods?{urllib.parse.urlencode({'labelSelector': selector})}")
        newest: dict[int, tuple[str, str]] = {}
        for item in json.loads(text).get("items") or []:
            meta = item.get("metadata") or {}
            index = str((meta.get("labels") or {}).get(tj.INDEX_LABEL, "0"))
            key = int(index) if index.isdigit() else 0
            stamp = str(meta.get("creationTimestamp") or "")
            if key not in newest or stamp >= newest[key][0]:
                newest[key] = (stamp, str(meta.get("name")))
        if not newest:
            raise SchedulerError(f"no pods with label {selector} in namespace {ns} (yet)",
                                 f"`kubectl get trainjob {name} -n {ns} -o yaml` shows why (queued? suspended?)")
        return [newest[k][1] for k in sorted(newest)]

    def logs(self, job_id: str, rank: int | None = None) -> str:
        ns, _, rec = self._locate(job_id)
        container = APIS[self._kind(rec)][3]
        pods = self.pods(job_id)
        if rank is not None:
            node = rank // max(1, rec.nproc_per_node)
            if node >= len(pods):
                raise SchedulerError(f"rank {rank} is not in job {job_id} ({len(pods)} pods)")
            pods = [pods[node]]
        api = self._api(rec)
        parts = []
        for pod in pods:
            text = self._read(api, ["logs", pod, "-n", ns, "-c", container],
                              f"/api/v1/namespaces/{ns}/pods/{pod}/log?container={container}", timeout=120)
            parts.append(text if len(pods) == 1 else f"==> {pod} <==\n{text}")
        return "".join(parts)

    def list_jobs(self) -> list[JobStatus]:
        """torchhpc's TrainJobs and PyTorchJobs (label ``app.kubernetes.io/managed-by=torchhpc``).

        Listed per namespace our records name (``default`` without records), with
        each record's transport, so no cluster-wide permission is needed.
        """
        where: dict[tuple[str, str], JobRecord] = {}
        for path in sorted(record_dir().glob(f"{self.name}-*.json")):
            rec = read_record(self.name, path.stem[len(self.name) + 1:])
            where.setdefault((self._kind(rec), rec.namespace or "default"), rec)
        if not where:
            where[("trainjob", "default")] = JobRecord(self.name, "")
        out: list[JobStatus] = []
        selector = "app.kubernetes.io/managed-by=torchhpc"
        for (kind, ns), rec in sorted(where.items()):
            resource, group, plural, _, _ = APIS[kind]
            text = self._read(self._api(rec), ["get", resource, "-n", ns, "-l", selector, "-o", "json"],
                              f"{group}/namespaces/{ns}/{plural}?{urllib.parse.urlencode({'labelSelector': selector})}",
                              hint=f"`kubectl config current-context` names the cluster; {APIS[kind][4]}")
            for item in json.loads(text).get("items") or []:
                job = f"{ns}/{(item.get('metadata') or {}).get('name', '')}"
                out.append(tj.status_from_trainjob(job, item) if kind == "trainjob" else status_from_job(job, item))
        return out


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
