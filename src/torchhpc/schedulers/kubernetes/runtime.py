"""A namespaced Kubeflow Trainer v2 ``TrainingRuntime`` whose JobSet restarts on infrastructure
failures and fails fast on the program's own, keyed by the class exit codes (core/exitcodes.py).

A TrainJob has no restart count of its own: its runtime's JobSet does (``failurePolicy``). With
``--max-restarts N`` the render adds this runtime beside the TrainJob, which names it in
``runtimeRef``. How a failure travels (Trainer v2.3.0's CRD; JobSet and Job semantics):

* the ``node`` Job's ``podFailurePolicy`` (``restartPolicy: Never``, ``backoffLimit: 0``):
  a pod evicted or its node drained (condition ``DisruptionTarget``) is replaced without
  counting (``Ignore``); an infrastructure class's exit code is counted (``Count``), so the Job
  fails with ``BackoffLimitExceeded``; any other non-zero code (a user class, or a code that is
  not ours: never guess) fails the Job at once (``FailJob``, reason ``PodFailurePolicy``);
* the JobSet's ``failurePolicy``: ``PodFailurePolicy`` -> ``FailJobSet`` (fail fast), and
  ``BackoffLimitExceeded`` -> ``RestartJobSet`` (recreate every pod), at most ``N`` times.

Kubeflow Trainer v2.4.0 limits a runtime's ReplicatedJob names to 20 characters: ours is ``node``,
as in the torch runtimes the TrainJob's ``runtimePatches`` address.
"""

from __future__ import annotations

from typing import Any

from torchhpc.core.exitcodes import EXIT_CODES, RESTARTABLE
from torchhpc.core.units import counted

__all__ = ["MAX_REPLICATED_JOB_NAME", "RUNTIME_KIND", "failure_policy", "pod_failure_policy", "restart_note",
           "runtime_name", "training_runtime"]

RUNTIME_KIND = "TrainingRuntime"
MAX_REPLICATED_JOB_NAME = 20  # Trainer v2.4.0's limit on a runtime's ReplicatedJob names
NODE = "node"


def runtime_name(job_name: str) -> str:
    """The runtime of one job: ``NAME-restarts`` within the 63 characters of a label."""
    return f"{job_name[:63 - len('-restarts')].rstrip('-')}-restarts"


def pod_failure_policy() -> dict[str, Any]:
    infra = sorted(EXIT_CODES[k] for k in RESTARTABLE)
    return {"rules": [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        {"action": "Count", "onExitCodes": {"containerName": NODE, "operator": "In", "values": infra}},
        {"action": "FailJob", "onExitCodes": {"containerName": NODE, "operator": "NotIn", "values": infra}},
    ]}


def failure_policy(max_restarts: int) -> dict[str, Any]:
    return {
        "maxRestarts": max_restarts,
        "restartStrategy": "Recreate",
        "rules": [
            {"name": "userClassesFailFast", "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]},
            {"name": "infrastructureRestarts", "action": "RestartJobSet", "onJobFailureReasons": ["BackoffLimitExceeded"]},
        ],
    }


def training_runtime(job_name: str, namespace: str, image: str, nodes: int, max_restarts: int) -> dict[str, Any]:
    """The runtime as plain data; the TrainJob's ``trainer`` (command, env, resources) and
    ``runtimePatches`` fill in the ``node`` container as they do for the stock torch runtime."""
    job: dict[str, Any] = {
        "name": NODE,
        "replicas": 1,
        "template": {
            "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
            "spec": {
                "backoffLimit": 0,
                "podFailurePolicy": pod_failure_policy(),
                "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": NODE, "image": image}]}},
            },
        },
    }
    assert len(job["name"]) <= MAX_REPLICATED_JOB_NAME
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": RUNTIME_KIND,
        "metadata": {"name": runtime_name(job_name), "namespace": namespace,
                     "labels": {"trainer.kubeflow.org/framework": "torch", "app.kubernetes.io/managed-by": "torchhpc"}},
        "spec": {
            "mlPolicy": {"numNodes": nodes, "torch": {}},  # numProcPerNode: the TrainJob's trainer
            "template": {"spec": {"failurePolicy": failure_policy(max_restarts), "replicatedJobs": [job]}},
        },
    }


def restart_note(runtime: dict[str, Any]) -> str:
    """What the dry run says about the runtime it renders."""
    infra = ", ".join(f"{k} {EXIT_CODES[k]}" for k in sorted(RESTARTABLE, key=EXIT_CODES.__getitem__))
    n = runtime["spec"]["template"]["spec"]["failurePolicy"]["maxRestarts"]
    return (f"TrainingRuntime {runtime['metadata']['name']}: its JobSet restarts up to {counted(n, 'time')} when a pod exits "
            f"with an infrastructure class ({infra}) or is disrupted, and fails fast on any other exit code")
