"""Kubernetes backend, ``--opt api=pytorchjob``: PyTorchJob manifests validated against the real CRD schema, and the API calls.

(The default TrainJob render has its own tests: tests/unit/test_trainjob.py.)

What is real: every rendered manifest is parsed back by PyYAML and validated
with ``jsonschema`` against the Kubeflow training-operator's PyTorchJob CRD
schema (``tests/data/kubernetes/pytorchjob-v1-openapi.json``: the CRD's
``spec.versions[0].schema.openAPIV3Schema`` with descriptions stripped), plus a
check that no field we emit would be pruned by the API server as unknown. The
pod command is run by a real bash with a stand-in ``python``.

What is fake: the Kubernetes API server. None can run here, so a small local
HTTP server (``FakeKubeAPI`` in tests/unit/kube_fake.py, on 127.0.0.1) implements the few endpoints
we call -- create/get/delete a PyTorchJob, read a pod's log -- checks the bearer
token, and validates what it receives against the same CRD schema, as a real
API server would. The kubectl path answers through a FakeRunner.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.conftest import REPO
from tests.fakes import FakeRunner
from tests.unit.kube_fake import (
    PYTORCHJOB_SCHEMA,
    FakeKubeAPI,
    fake_api_fixture,  # noqa: F401  (the fake_api fixture)
    unknown_fields,
    validate_pytorchjob,
)
from tests.unit.test_pbs import check_golden
from torchhpc.core.spec import ContainerSpec, Entrypoint, JobSpec
from torchhpc.errors import SchedulerError, SpecError
from torchhpc.schedulers import get_scheduler
from torchhpc.schedulers.kubernetes.kubernetes import (
    KubeAPI,
    KubernetesScheduler,
    manifest,
    status_from_job,
    to_yaml,
)

SCHEMA = PYTORCHJOB_SCHEMA
GOLDEN = REPO / "tests" / "golden" / "kubernetes"
IMAGE = "nvcr.io/nvidia/pytorch:24.01-py3"
PJ = ("api", "pytorchjob")  # this file tests the PyTorchJob render; the default TrainJob: test_trainjob.py


def spec(**kw: object) -> JobSpec:
    base: dict[str, object] = dict(
        entrypoint=Entrypoint.parse(["examples/pi.py", "--n", "1000000"]),
        nodes=2,
        nproc_per_node=4,
        gpus_per_node=4,
        name="pi",
        output_dir="/work/out",
        scheduler="kubernetes",
        options=(PJ, ("image", IMAGE)),
    )
    base.update(kw)
    return JobSpec(**base)  # type: ignore[arg-type]


CASES: dict[str, JobSpec] = {
    "pi_2x4_gpu": spec(),
    "rcp_rdma_pvc": spec(
        mem="64G",
        time="02:00:00",
        cpus_per_task=8,
        env=(("NCCL_IB_HCA", "mlx5"), ("NCCL_SOCKET_NTHREADS", "4")),
        options=(
            PJ,
            ("image", "registry.rcp.epfl.ch/meditron-ddx/basic:latest"),
            ("namespace", "runai-mlo"),
            ("pvc", "mlo-scratch:/mloscratch"),
            ("rdma", "kube-system/roce"),
            ("shm_size", "16G"),
            ("workdir", "/mloscratch/homes/alice"),
        ),
    ),
    "single_node_cpu": spec(nodes=1, gpus_per_node=0, options=(PJ, ("image", IMAGE), ("restart_policy", "OnFailure"))),
}


def validate(obj: dict[str, Any]) -> None:
    validate_pytorchjob(obj)


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_manifest_validates(case: str) -> None:
    sub = KubernetesScheduler(runner=FakeRunner()).render(CASES[case])
    check_golden(GOLDEN / f"{case}.yaml", sub.script or "")
    obj = yaml.safe_load(sub.script or "")
    assert obj == manifest(CASES[case], obj["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"][
        "containers"][0]["image"], obj["metadata"]["namespace"])
    validate(obj)
    assert sub.argv == ("kubectl", "apply", "-f", "-") and sub.stdin == sub.script


def test_schema_check_catches_mistakes() -> None:
    """The validation really bites: a wrong type and an unknown field are both reported."""
    obj = yaml.safe_load(KubernetesScheduler(runner=FakeRunner()).render(spec()).script or "")
    bad = json.loads(json.dumps(obj))
    bad["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = "1"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft4Validator(SCHEMA).validate(bad)
    typo = json.loads(json.dumps(obj))
    typo["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["volumeMount"] = []
    assert unknown_fields(typo["spec"], SCHEMA["properties"]["spec"], "spec") == [
        "spec.pytorchReplicaSpecs.Worker.template.spec.containers[0].volumeMount"
    ]


def test_geometry_resources_and_volumes() -> None:
    obj = manifest(CASES["rcp_rdma_pvc"], "img", "ns")
    rs = obj["spec"]["pytorchReplicaSpecs"]
    assert rs["Master"]["replicas"] == 1 and rs["Worker"]["replicas"] == 1
    assert obj["spec"]["nprocPerNode"] == "4"
    assert obj["spec"]["runPolicy"]["activeDeadlineSeconds"] == 7200
    pod = rs["Worker"]["template"]
    assert pod["metadata"]["annotations"] == {"k8s.v1.cni.cncf.io/networks": "kube-system/roce"}
    c = pod["spec"]["containers"][0]
    assert c["name"] == "pytorch"
    assert c["resources"]["limits"] == {"nvidia.com/gpu": 4, "rdma/rdma": 1, "cpu": 32, "memory": "64Gi"}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}} in pod["spec"]["volumes"]
    assert {"name": "pvc-0", "persistentVolumeClaim": {"claimName": "mlo-scratch"}} in pod["spec"]["volumes"]
    assert "Worker" not in manifest(CASES["single_node_cpu"], "img", "ns")["spec"]["pytorchReplicaSpecs"]
    amd = manifest(spec(gpu_kind="amd"), "img", "ns")
    assert "amd.com/gpu" in amd["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0][
        "resources"]["limits"]


def test_yaml_round_trip_hostile(hostile: str) -> None:
    """Every hostile string survives YAML exactly, as an env value, a script argument and a label-free name."""
    s = spec(env=(("X", hostile),), entrypoint=Entrypoint.parse(["pi.py", hostile]))
    obj = manifest(s, "img", "ns")
    assert yaml.safe_load(to_yaml(obj)) == obj
    for word in ("yes", "no", "on", "null", "~", "true", "1e3", "0x10", "- a", "a: b", "[x]", "{y}", "&a", "*b"):
        assert yaml.safe_load(to_yaml({"k": word, word: [word]})) == {"k": word, word: [word]}


def test_pod_command_runs_in_bash(tmp_path: Path, hostile: str) -> None:
    """The container command, run by bash with the operator's env: torchrun gets pods' geometry and exact args."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "python"
    fake.write_text("#!/usr/bin/env python3\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    fake.chmod(0o755)
    command = manifest(spec(entrypoint=Entrypoint.parse(["pi.py", hostile, "-v"])), "img", "ns")["spec"][
        "pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["command"]
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "MASTER_ADDR": "pi-master-0", "MASTER_PORT": "23456",
           "RANK": "1", "WORLD_SIZE": "8"}
    r = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    argv = json.loads(r.stdout)
    assert argv[argv.index("--nnodes") + 1] == "2"  # written in, never the operator's WORLD_SIZE
    assert argv[argv.index("--node-rank") + 1] == "1"
    assert argv[argv.index("--master-addr") + 1] == "pi-master-0"
    assert argv[-3:] == ["pi.py", hostile, "-v"]
    env["PET_NODE_RANK"] = "3"  # newer operators: PET_NODE_RANK wins
    argv = json.loads(subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path).stdout)
    assert argv[argv.index("--node-rank") + 1] == "3"
    assert not list(tmp_path.glob("pwned*"))


def test_errors() -> None:
    k = KubernetesScheduler(runner=FakeRunner())
    with pytest.raises(SpecError, match="needs a container image"):
        k.render(spec(options=(PJ,)))
    with pytest.raises(SpecError, match="unknown kubernetes option"):
        k.render(spec(options=(PJ, ("image", "i"), ("partition", "q"))))
    with pytest.raises(SpecError, match="one pod per node"):
        k.render(spec(launcher="mpirun"))
    with pytest.raises(SpecError, match="restart_policy"):
        k.render(spec(options=(PJ, ("image", "i"), ("restart_policy", "Sometimes"))))
    with pytest.raises(SpecError, match="no training runtime"):
        k.render(spec(options=(PJ, ("image", "i"), ("runtime", "torch-distributed"))))
    with pytest.raises(SpecError, match="CLAIM:/mount/path"):
        k.render(spec(options=(PJ, ("image", "i"), ("pvc", "scratch"))))
    c = ContainerSpec(image="docker.io/library/python:3.11", runtime="docker")
    assert "docker.io/library/python:3.11" in (k.render(spec(options=(PJ,), container=c)).script or "")


def test_status_from_conditions() -> None:
    def job(*conds: tuple[str, str]) -> dict[str, Any]:
        return {"metadata": {"name": "pi"}, "status": {"conditions": [
            {"type": t, "status": s, "reason": f"PyTorchJob{t}", "message": f"PyTorchJob pi is {t.lower()}."}
            for t, s in conds]}}

    assert status_from_job("pi", {"metadata": {"name": "pi"}}).state == "PENDING"
    assert status_from_job("pi", job(("Created", "True"))).state == "PENDING"
    assert status_from_job("pi", job(("Created", "True"), ("Running", "True"))).state == "RUNNING"
    done = status_from_job("pi", job(("Created", "True"), ("Running", "False"), ("Succeeded", "True")))
    assert (done.state, done.exit_code, done.ok) == ("COMPLETED", 0, True)
    failed = status_from_job("pi", job(("Created", "True"), ("Restarting", "True"), ("Failed", "True")))
    assert (failed.state, failed.restarts, failed.reason) == ("FAILED", 1, "PyTorchJob pi is failed.")


# --- through the fake API server (tests/unit/kube_fake.py) ------------------------------------


def test_submit_status_logs_cancel_over_http(fake_api: tuple[FakeKubeAPI, Path], tmp_path: Path) -> None:
    api, token = fake_api
    opts = (PJ, ("image", IMAGE), ("namespace", "team-a"), ("api_server", api.url), ("token_file", str(token)))
    sched = KubernetesScheduler(runner=FakeRunner(present=set()))  # no kubectl: the HTTP path
    job = sched.submit(spec(options=opts, output_dir=str(tmp_path / "out")))
    assert job == "pi" and ("team-a", "pi") in api.jobs
    assert (tmp_path / "out" / "pi.pytorchjob.yaml").exists()
    assert sched.status(job).state == "PENDING"
    api.jobs[("team-a", "pi")]["status"]["conditions"] += [
        {"type": "Running", "status": "False"}, {"type": "Succeeded", "status": "True"}]
    assert sched.wait(job, poll=0.01).state == "COMPLETED"
    assert sched.status("team-a/pi").state == "COMPLETED"
    assert sched.logs(job, rank=5) == "log of pi-worker-0 (pytorch)\n"
    assert sched.logs(job) == ("==> pi-master-0 <==\nlog of pi-master-0 (pytorch)\n"
                               "==> pi-worker-0 <==\nlog of pi-worker-0 (pytorch)\n")
    with pytest.raises(SchedulerError, match="409"):
        sched.submit(spec(options=opts, output_dir=str(tmp_path / "out")))
    sched.cancel(job)
    assert ("team-a", "pi") not in api.jobs
    with pytest.raises(SchedulerError, match="404"):
        sched.status(job)


def test_http_rejects_bad_token_and_missing_server(fake_api: tuple[FakeKubeAPI, Path], tmp_path: Path) -> None:
    api, _ = fake_api
    wrong = tmp_path / "wrong"
    wrong.write_text("nope")
    opts = (PJ, ("image", IMAGE), ("api_server", api.url), ("token_file", str(wrong)))
    with pytest.raises(SchedulerError, match="401"):
        KubernetesScheduler(runner=FakeRunner(present=set())).submit(spec(options=opts, output_dir=str(tmp_path)))
    with pytest.raises(SchedulerError, match="no kubectl and no Kubernetes API server"):
        KubeAPI.from_options({}, environ={})
    incluster = KubeAPI.from_options({"token_file": str(wrong)}, environ={"KUBERNETES_SERVICE_HOST": "10.0.0.1"})
    assert incluster.server == "https://10.0.0.1:443" and incluster.token == "nope"


def test_kubectl_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHHPC_STATE_DIR", str(tmp_path))
    got = {"status": {"conditions": [{"type": "Running", "status": "True"}]}, "metadata": {"name": "pi"}}
    runner = FakeRunner(responses={"kubectl": lambda argv, _i: json.dumps(got) if argv[1] == "get" else "ok\n"})
    sched = KubernetesScheduler(runner=runner)
    s = spec(options=(PJ, ("image", IMAGE), ("namespace", "ml")), output_dir=str(tmp_path))
    job = sched.submit(s)
    (create, cm), (argv, stdin) = runner.calls[:2]  # the boot ConfigMap first, then the job that mounts it
    assert create == ["kubectl", "create", "-f", "-"] and yaml.safe_load(cm or "")["kind"] == "ConfigMap"
    assert argv == ["kubectl", "apply", "-f", "-"] and stdin is not None
    validate(yaml.safe_load(stdin))
    assert sched.status(job).state == "RUNNING"
    assert runner.calls[-1][0] == ["kubectl", "get", "pytorchjobs.kubeflow.org", "pi", "-n", "ml", "-o", "json"]
    sched.logs(job, rank=0)
    assert runner.calls[-1][0] == ["kubectl", "logs", "pi-master-0", "-n", "ml", "-c", "pytorch"]
    sched.cancel(job)
    assert runner.calls[-1][0] == ["kubectl", "delete", "pytorchjobs.kubeflow.org", "pi", "-n", "ml"]


def test_registered() -> None:
    assert isinstance(get_scheduler("kubernetes", runner=FakeRunner()), KubernetesScheduler)


def test_profile_style_annotation_and_resources() -> None:
    s = spec(options=(
        PJ,
        ("image", IMAGE),
        ("annotation", "k8s.v1.cni.cncf.io/networks=kube-system/roce"),
        ("extended-resource", "rdma/rdma=1"),
        ("large-shm", "true"),
    ))
    obj = manifest(s, IMAGE, "ns")
    validate(obj)
    tpl = obj["spec"]["pytorchReplicaSpecs"]["Master"]["template"]
    assert tpl["metadata"]["annotations"] == {"k8s.v1.cni.cncf.io/networks": "kube-system/roce"}
    assert tpl["spec"]["containers"][0]["resources"]["limits"]["rdma/rdma"] == 1


def test_cli_dry_run_prints_valid_manifest(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Acceptance: `torchhpc run --scheduler kubernetes --dry-run` prints a manifest that validates."""
    from torchhpc.cli.main import main

    rc = main(["run", "--scheduler", "kubernetes", "--nodes", "2", "--gpus-per-node", "4", "--image", IMAGE,
               "--output-dir", str(tmp_path), "--opt", "api=pytorchjob", "--dry-run", "examples/pi.py"])
    out = capsys.readouterr().out
    assert rc == 0
    text = out.split(" ---\n", 1)[1].split("# --- submit with ---")[0]
    obj = yaml.safe_load(text)
    validate(obj)
    assert obj["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 1
    assert "kubectl apply -f -" in out


def test_env_detector_counts_processes_not_pods() -> None:
    """A pod of our manifest, as the (older) operator fills it: RANK/WORLD_SIZE count pods.

    Outside torchrun's workers (e.g. `torchhpc env` in the pod), torchhpc's
    detector, given the TORCHHPC_NPROC_PER_NODE we put in the container, knows
    there are 4 processes per pod and refuses to read RANK=1 as a process rank.
    """
    from torchhpc.env import detect
    from torchhpc.errors import EnvironmentDetectionError

    c = manifest(spec(), IMAGE, "ns")["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    pod_env = {e["name"]: e["value"] for e in c["env"]}
    assert pod_env["TORCHHPC_NPROC_PER_NODE"] == "4"
    pod_env.update({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "MASTER_ADDR": "pi-master-0", "MASTER_PORT": "23456",
                    "RANK": "1", "WORLD_SIZE": "2", "PYTHONUNBUFFERED": "0"})
    with pytest.raises(EnvironmentDetectionError, match="pod's index"):
        detect(pod_env)


@pytest.mark.parametrize("text", [
    "a\nb", "a\nb\n", "a\nb\n\n\n", "x\n\n  y\n", "\nfirst\n", "tab\tin\nx", "é ü\n😀 ok\nz", "a\n...\n---\nb",
    "#c\n- d: e\n", "a \nb  \n", 'q"\\x\n\'s $HOME', "  lead\nx", "ctrl\x01\nx", "a\r\nb", "\n\n", "\n \nx",
])
def test_multi_line_strings_read_back_exactly(text: str) -> None:
    """A literal block where one holds the text as it is (a pod's script reads as a script), else double-quoted."""
    obj = {"command": ["bash", "-c", text], "env": {"v": text}}
    out = to_yaml(obj)
    assert yaml.safe_load(out) == obj
    literal = (not text.lstrip("\n").startswith((" ", "\t")) and text.strip("\n") and not text.endswith("\n\n")
               and not any(c in text for c in "\x01\r"))
    assert ("- |" in out) == bool(literal), out


@pytest.mark.parametrize(("stderr", "inline"), [
    ('Error from server (AlreadyExists): configmaps "torchhpc-boot-x" already exists', False),
    ('Error from server (Forbidden): configmaps is forbidden: User "u" cannot create resource "configmaps"', True),
])
def test_the_boot_configmap_exists_or_the_file_goes_inline(stderr: str, inline: bool, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """One boot file per namespace (a ConfigMap named by its hash); where it cannot be made, the pods carry it."""
    monkeypatch.setenv("TORCHHPC_STATE_DIR", str(tmp_path))
    runner = FakeRunner(responses={"kubectl": lambda argv, _i: (1, "", stderr) if argv[1] == "create" else "ok\n"})
    KubernetesScheduler(runner=runner).submit(spec(options=(PJ, ("image", IMAGE)), output_dir=str(tmp_path)))
    text = runner.calls[1][1] or ""
    validate(yaml.safe_load(text))
    assert ("TORCHHPC_BOOT_PY" in text) is inline and ("torchhpc-boot-" in text and "configMap" in text) is not inline
    sub = KubernetesScheduler(runner=FakeRunner()).render(spec(options=(PJ, ("image", IMAGE), ("boot", "inline"))))
    assert "TORCHHPC_BOOT_PY" in (sub.script or "") and "configMap" not in (sub.script or "")
