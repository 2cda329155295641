"""A fake Kubernetes API server and the CRD checks it applies (shared by the PyTorchJob and TrainJob tests).

Why a fake: no Kubernetes API server can run on the development machine. What
keeps it honest: every object it accepts is validated like the real server
would, against the published CRD schemas in ``tests/data/kubernetes/``:

* ``pytorchjob-v1-openapi.json``: the training-operator v1 PyTorchJob CRD's
  ``openAPIV3Schema`` (descriptions stripped);
* ``trainjob-v1alpha1-openapi.json``: Kubeflow Trainer v2.3.0's TrainJob CRD
  (identical to the project's shared copy), validated with the ``x-kubernetes-*``
  keys removed, plus the CEL rules and webhook checks that matter for what we
  render: the RFC 1035 name of at most 63 characters (CRD CEL rules), no
  reserved ``PET_*`` name in ``trainer.env`` (the torch plugin's webhook), an
  integer ``numProcPerNode`` (the schema's type), and no env on the ``node``
  container through ``runtimePatches`` (the Trainer API's documented restriction).

Plus a check that no field we emit would be pruned by the API server as unknown.
For a TrainJob the fake plays the JobSet controller too: it creates one pod per
node with the labels JobSet and Job put on them (``jobset.sigs.k8s.io/jobset-name``,
``batch.kubernetes.io/job-completion-index``) and a random suffix.
"""

from __future__ import annotations

import json
import re
import secrets
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests.conftest import REPO

DATA = REPO / "tests" / "data" / "kubernetes"
PYTORCHJOB_SCHEMA: dict[str, Any] = json.loads((DATA / "pytorchjob-v1-openapi.json").read_text())["openAPIV3Schema"]
TRAINJOB_RAW: dict[str, Any] = json.loads((DATA / "trainjob-v1alpha1-openapi.json").read_text())["openAPIV3Schema"]
RESERVED = {"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"}


def strip_x(obj: Any) -> Any:
    """The schema without ``x-kubernetes-*`` keys (jsonschema does not know them)."""
    if isinstance(obj, dict):
        return {k: strip_x(v) for k, v in obj.items() if not k.startswith("x-kubernetes-")}
    if isinstance(obj, list):
        return [strip_x(v) for v in obj]
    return obj


TRAINJOB_SCHEMA: dict[str, Any] = strip_x(TRAINJOB_RAW)
RUNTIME_RAW: dict[str, Any] = json.loads((DATA / "trainingruntime-v1alpha1-openapi.json").read_text())["openAPIV3Schema"]
RUNTIME_SCHEMA: dict[str, Any] = strip_x(RUNTIME_RAW)


def unknown_fields(obj: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Fields the API server would prune: not declared under ``properties`` of a structural schema."""
    out: list[str] = []
    if isinstance(obj, dict):
        if schema.get("x-kubernetes-preserve-unknown-fields"):
            return out
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for k, v in obj.items():
            if props is not None and k in props:
                out += unknown_fields(v, props[k], f"{path}.{k}")
            elif isinstance(extra, dict):
                out += unknown_fields(v, extra, f"{path}.{k}")
            elif props is not None or extra is False:
                out.append(f"{path}.{k}")
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for i, v in enumerate(obj):
            out += unknown_fields(v, schema["items"], f"{path}[{i}]")
    return out


def validate_pytorchjob(obj: dict[str, Any]) -> None:
    jsonschema.Draft4Validator(PYTORCHJOB_SCHEMA).validate(obj)
    # apiVersion/kind/metadata are the API server's own; spec must be fully declared by the CRD.
    assert unknown_fields(obj["spec"], PYTORCHJOB_SCHEMA["properties"]["spec"], "spec") == []


def trainjob_rule_errors(obj: dict[str, Any]) -> list[str]:
    """What the TrainJob CRD's CEL rules and the Trainer webhook refuse, among what a renderer could get wrong."""
    errors = []
    name = str((obj.get("metadata") or {}).get("name", ""))
    if not re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name):
        errors.append("metadata.name must match RFC 1035 DNS label format")
    if len(name) > 63:
        errors.append("metadata.name must be no more than 63 characters")
    trainer = (obj.get("spec") or {}).get("trainer") or {}
    reserved = sorted(RESERVED & {e.get("name") for e in trainer.get("env") or []})
    if reserved:
        errors.append(f"spec.trainer.env: must not have reserved envs, invalid envs configured: {reserved}")
    if "numProcPerNode" in trainer and (type(trainer["numProcPerNode"]) is not int):
        errors.append("spec.trainer.numProcPerNode: must be an integer")
    for patch in (obj.get("spec") or {}).get("runtimePatches") or []:
        jobs = (((patch.get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec") or {}).get("replicatedJobs")
        for job in jobs or []:
            pod = (((job.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec") or {}
            for c in pod.get("containers") or []:
                if c.get("name") == "node" and c.get("env"):
                    errors.append("runtimePatches: env of the node container goes through spec.trainer.env")
    return errors


def validate_trainjob(obj: dict[str, Any]) -> None:
    jsonschema.Draft4Validator(TRAINJOB_SCHEMA).validate(obj)
    assert unknown_fields(obj["spec"], TRAINJOB_RAW["properties"]["spec"], "spec") == []
    assert trainjob_rule_errors(obj) == []


# (group path, plural) -> (validator, kind as the API server names it)
KINDS = {
    ("kubeflow.org/v1", "pytorchjobs"): (validate_pytorchjob, "pytorchjobs.kubeflow.org"),
    ("trainer.kubeflow.org/v1alpha1", "trainjobs"): (validate_trainjob, "trainjobs.trainer.kubeflow.org"),
}


class FakeKubeAPI:
    """A few Kubernetes API endpoints on 127.0.0.1, with CRD validation like the real server's."""

    TOKEN = "s3cret-token"

    def __init__(self) -> None:
        self.jobs: dict[tuple[str, str], dict[str, Any]] = {}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.runtimes: dict[tuple[str, str], dict[str, Any]] = {}  # TrainingRuntimes, by (namespace, name)
        self.requests: list[tuple[str, str]] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _send(self, code: int, body: Any, ctype: str = "application/json") -> None:
                data = (body if isinstance(body, str) else json.dumps(body)).encode()
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _status(self, code: int, reason: str, message: str) -> None:
                self._send(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                  "reason": reason, "message": message, "code": code})

            def _route(self, method: str) -> None:
                api.requests.append((method, self.path))
                if self.headers.get("Authorization") != f"Bearer {api.TOKEN}":
                    return self._status(401, "Unauthorized", "Unauthorized")
                path, _, query = self.path.partition("?")
                params = dict(urllib.parse.parse_qsl(query))
                m = re.match(r"^/apis/(kubeflow.org/v1|trainer.kubeflow.org/v1alpha1)/namespaces/([^/]+)/"
                             r"(pytorchjobs|trainjobs)(?:/([^/]+))?$", path)
                if m and (m.group(1), m.group(3)) in KINDS:
                    return self._job(method, m.group(1), m.group(2), m.group(3), m.group(4), params)
                m = re.match(r"^/apis/trainer.kubeflow.org/v1alpha1/namespaces/([^/]+)/trainingruntimes$", path)
                if m and method == "POST":
                    body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                    try:
                        jsonschema.Draft4Validator(RUNTIME_SCHEMA).validate(body)
                    except jsonschema.ValidationError as e:
                        return self._status(422, "Invalid", str(e)[:300])
                    key = (m.group(1), body["metadata"]["name"])
                    if key in api.runtimes:
                        return self._status(409, "AlreadyExists", f'TrainingRuntime "{key[1]}" already exists')
                    api.runtimes[key] = body
                    return self._send(201, body)
                m = re.match(r"^/api/v1/namespaces/([^/]+)/pods$", path)
                if m and method == "GET":
                    want = dict(kv.split("=", 1) for kv in params.get("labelSelector", "").split(",") if kv)
                    items = [p for (ns, _), p in api.pods.items() if ns == m.group(1)
                             and all(p["metadata"]["labels"].get(k) == v for k, v in want.items())]
                    return self._send(200, {"kind": "PodList", "items": items})
                m = re.match(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)/log$", path)
                if m and method == "GET":
                    return self._send(200, f"log of {m.group(2)} ({params.get('container')})\n", "text/plain")
                return self._status(404, "NotFound", "the server could not find the requested resource")

            def _job(self, method: str, group: str, ns: str, plural: str, name: str | None,
                     params: dict[str, str]) -> None:
                check, kind = KINDS[(group, plural)]
                if method == "GET" and name is None:
                    want = dict(kv.split("=", 1) for kv in params.get("labelSelector", "").split(",") if kv)
                    items = [j for (n, _), j in api.jobs.items() if n == ns and j["apiVersion"].startswith(group)
                             and all(j["metadata"].get("labels", {}).get(k) == v for k, v in want.items())]
                    return self._send(200, {"items": items})
                if method == "POST" and name is None:
                    body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                    try:
                        check(body)
                    except (jsonschema.ValidationError, AssertionError) as e:
                        return self._status(422, "Invalid", str(e)[:300])
                    key = (ns, body["metadata"]["name"])
                    if key in api.jobs:
                        return self._status(409, "AlreadyExists", f'{kind} "{key[1]}" already exists')
                    body["status"] = {"conditions": [{"type": "Created", "status": "True"}]} if "kubeflow.org/v1" == group else {}
                    api.jobs[key] = body
                    if plural == "trainjobs":
                        api.start_pods(ns, body)
                    return self._send(201, body)
                if (ns, name) not in api.jobs:
                    return self._status(404, "NotFound", f'{kind} "{name}" not found')
                if method == "GET":
                    return self._send(200, api.jobs[(ns, str(name))])
                if method == "DELETE":
                    del api.jobs[(ns, str(name))]
                    return self._send(200, {"kind": "Status", "status": "Success"})
                return self._status(405, "MethodNotAllowed", method)

            def do_GET(self) -> None:
                self._route("GET")

            def do_POST(self) -> None:
                self._route("POST")

            def do_DELETE(self) -> None:
                self._route("DELETE")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def start_pods(self, ns: str, job: dict[str, Any]) -> None:
        """What JobSet does for the torch runtime: one Job ``NAME-node-0`` with an indexed pod per node."""
        name = job["metadata"]["name"]
        for index in range(int(job["spec"]["trainer"]["numNodes"])):
            pod = f"{name}-node-0-{index}-{secrets.token_hex(3)[:5]}"
            self.pods[(ns, pod)] = {"metadata": {"name": pod, "namespace": ns, "creationTimestamp": "2026-08-01T10:00:00Z",
                                                 "labels": {"jobset.sigs.k8s.io/jobset-name": name,
                                                            "batch.kubernetes.io/job-completion-index": str(index)}}}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(name="fake_api")
def fake_api_fixture(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FakeKubeAPI, Path]]:
    """``fake_api``: a fake API server with its bearer token in a file, and a state directory of the test's own
    (a module imports this function to use the fixture)."""
    monkeypatch.setenv("TORCHHPC_STATE_DIR", str(tmp_path / "state"))
    api = FakeKubeAPI()
    token = tmp_path / "token"
    token.write_text(FakeKubeAPI.TOKEN + "\n")
    yield api, token
    api.close()
