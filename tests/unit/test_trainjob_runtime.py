"""``--max-restarts`` on Kubernetes: a TrainingRuntime whose JobSet restarts on the infrastructure
classes and fails fast on the program's own, keyed by the class exit codes (core/exitcodes.py).

What is real: the rendered runtime is parsed back by PyYAML and validated with ``jsonschema``
against Kubeflow Trainer v2.3.0's TrainingRuntime CRD schema
(tests/data/kubernetes/trainingruntime-v1alpha1-openapi.json: the shared CRD's
``spec.versions[0].schema``, descriptions dropped; ``x-kubernetes-*`` keys stripped here), checked
for fields the API server would prune, and its rules are walked with Job and JobSet semantics for
every class's exit code. What is fake: no API server or JobSet controller runs (none can here); the HTTP submission goes to
``FakeKubeAPI`` (tests/unit/kube_fake.py, on 127.0.0.1), which validates what it is sent.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.conftest import REPO
from tests.fakes import FakeRunner
from tests.unit.kube_fake import RUNTIME_RAW as RAW
from tests.unit.kube_fake import RUNTIME_SCHEMA as SCHEMA
from tests.unit.kube_fake import FakeKubeAPI, unknown_fields, validate_trainjob
from tests.unit.test_pbs import check_golden
from tests.unit.test_trainjob import spec
from torchhpc.core.exitcodes import EXIT_CODES, RESTARTABLE, class_of_exit
from torchhpc.diagnose.classify import CLASSES
from torchhpc.errors import SpecError
from torchhpc.schedulers.kubernetes.kubernetes import KubernetesScheduler
from torchhpc.schedulers.kubernetes.runtime import MAX_REPLICATED_JOB_NAME
from torchhpc.supervisor.policy import RESTART_CLASSES

GOLDEN = REPO / "tests" / "golden" / "kubernetes" / "runtime_max_restarts.yaml"


def _docs(max_restarts: int = 3, **kw: Any) -> list[dict[str, Any]]:
    sub = KubernetesScheduler(runner=FakeRunner()).render(spec(max_restarts=max_restarts, **kw))
    return [d for d in yaml.safe_load_all(sub.script or "") if d]


def test_the_exit_code_table() -> None:
    assert set(CLASSES) <= set(EXIT_CODES)
    codes = list(EXIT_CODES.values())
    assert len(set(codes)) == len(codes) and all(80 <= c <= 95 for c in codes)
    assert RESTARTABLE == RESTART_CLASSES  # the supervisor's policy decides; this is its copy for lower rooms
    assert class_of_exit(EXIT_CODES["hang"]) == "hang" and class_of_exit(1) is None and class_of_exit(137) is None


def test_the_runtime_validates_against_the_crd_and_the_trainjob_names_it() -> None:
    runtime, job = _docs()
    assert (runtime["kind"], job["kind"]) == ("TrainingRuntime", "TrainJob")
    jsonschema.Draft4Validator(SCHEMA).validate(runtime)
    assert unknown_fields(runtime["spec"], RAW["properties"]["spec"], "spec") == []
    names = [j["name"] for j in runtime["spec"]["template"]["spec"]["replicatedJobs"]]
    assert names == ["node"] and all(len(n) <= MAX_REPLICATED_JOB_NAME for n in names)
    assert job["spec"]["runtimeRef"] == {"name": runtime["metadata"]["name"], "apiGroup": "trainer.kubeflow.org",
                                         "kind": "TrainingRuntime"}
    assert runtime["metadata"]["namespace"] == job["metadata"]["namespace"]
    validate_trainjob(job)
    patched = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert [j["name"] for j in patched] == names  # the TrainJob's patches reach our runtime's job


def test_the_schema_bites() -> None:
    runtime, _job = _docs()
    bad = json.loads(json.dumps(runtime))
    bad["spec"]["template"]["spec"]["failurePolicy"]["rules"][0]["action"] = "RestartEverything"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft4Validator(SCHEMA).validate(bad)
    typo = json.loads(json.dumps(runtime))
    typo["spec"]["template"]["spec"]["failurePolicy"]["maxRestart"] = 3
    assert unknown_fields(typo["spec"], RAW["properties"]["spec"], "spec")


def _outcome(runtime: dict[str, Any], exit_code: int | None = None, condition: str = "") -> str:
    """Job then JobSet semantics: a failed pod's first matching podFailurePolicy rule, the Job's failure
    reason (backoffLimit 0), the JobSet's first matching failurePolicy rule (default RestartJobSet)."""
    (job,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    jspec = job["template"]["spec"]
    assert jspec["template"]["spec"]["restartPolicy"] == "Never" and jspec["backoffLimit"] == 0
    action = "Count"
    for rule in jspec["podFailurePolicy"]["rules"]:
        if "onPodConditions" in rule and any(c["type"] == condition for c in rule["onPodConditions"]):
            action = rule["action"]
            break
        on = rule.get("onExitCodes")
        if on and exit_code is not None and not condition:
            hit = exit_code in on["values"]
            if hit == (on["operator"] == "In"):
                action = rule["action"]
                break
    if action == "Ignore":
        return "replace the pod, uncounted"
    reason = "PodFailurePolicy" if action == "FailJob" else "BackoffLimitExceeded"
    for rule in runtime["spec"]["template"]["spec"]["failurePolicy"]["rules"]:
        if reason in rule.get("onJobFailureReasons", [reason]):
            return str(rule["action"])
    return "RestartJobSet"


def test_infrastructure_classes_restart_and_the_others_fail_fast() -> None:
    runtime, _job = _docs(max_restarts=2)
    assert runtime["spec"]["template"]["spec"]["failurePolicy"]["maxRestarts"] == 2
    for klass, code in EXIT_CODES.items():
        want = "RestartJobSet" if klass in RESTART_CLASSES else "FailJobSet"
        assert _outcome(runtime, code) == want, klass
    assert _outcome(runtime, 1) == "FailJobSet"  # not one of ours: never guess
    assert _outcome(runtime, 137) == "FailJobSet"
    assert _outcome(runtime, condition="DisruptionTarget") == "replace the pod, uncounted"  # a drained node


def test_golden_runtime() -> None:
    sub = KubernetesScheduler(runner=FakeRunner()).render(spec(max_restarts=3))
    check_golden(GOLDEN, sub.script or "")
    assert any("restarts up to 3 times" in n for n in sub.notes), sub.notes


def test_no_runtime_without_restarts_and_a_users_runtime_is_not_replaced_silently() -> None:
    (job,) = _docs(max_restarts=0)
    assert job["spec"]["runtimeRef"] == {"name": "torch-distributed"}
    with pytest.raises(SpecError, match="--opt runtime"):
        _docs(options=(("image", "reg/x:1"), ("runtime", "mine")))


def test_over_http_the_runtime_is_created_before_the_trainjob(tmp_path: Path) -> None:
    api = FakeKubeAPI()
    try:
        token = tmp_path / "token"
        token.write_text(FakeKubeAPI.TOKEN + "\n")
        opts = (("image", "reg/x:1"), ("namespace", "team-a"), ("api_server", api.url), ("token_file", str(token)))
        sched = KubernetesScheduler(runner=FakeRunner(present=set()))  # no kubectl: the HTTP path
        job = sched.submit(spec(options=opts, max_restarts=2, output_dir=str(tmp_path / "out")))
        posts = [p for m, p in api.requests if m == "POST"]
        assert [p.rsplit("/", 1)[1] for p in posts] == ["configmaps", "trainingruntimes", "trainjobs"], posts
        runtime = api.runtimes[("team-a", "pi-restarts")]
        assert runtime["spec"]["template"]["spec"]["failurePolicy"]["maxRestarts"] == 2
        assert api.jobs[("team-a", job)]["spec"]["runtimeRef"]["name"] == "pi-restarts"
    finally:
        api.close()
