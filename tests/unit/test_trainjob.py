"""Kubernetes backend, default render: a Kubeflow Trainer v2 ``TrainJob``, every option mapped or refused.

What is real: every rendered TrainJob is parsed back by PyYAML and validated
with ``jsonschema`` against Kubeflow Trainer v2.3.0's TrainJob CRD schema
(``tests/data/kubernetes/trainjob-v1alpha1-openapi.json``, ``x-kubernetes-*``
keys removed), checked for fields the API server would prune, and against the
CEL/webhook rules that matter here (tests/unit/kube_fake.py). The pod command
runs in a real bash with the variables the v2.3.0 torch plugin injects and a
stand-in ``python``; ``torchhpc env --explain`` runs as a real subprocess.

What is fake: the Kubernetes API server and the JobSet controller (no cluster
can run here): ``FakeKubeAPI`` in tests/unit/kube_fake.py, on 127.0.0.1.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.conftest import REPO
from tests.fakes import FakeRunner
from tests.unit.kube_fake import (
    TRAINJOB_SCHEMA,
    FakeKubeAPI,
    fake_api_fixture,  # noqa: F401  (the fake_api fixture)
    trainjob_rule_errors,
    validate_trainjob,
)
from tests.unit.test_pbs import check_golden
from torchhpc.core.depend import Dependency
from torchhpc.core.spec import ContainerSpec, Entrypoint, JobSpec
from torchhpc.errors import SchedulerError, SpecError
from torchhpc.schedulers.kubernetes.kubernetes import KubernetesScheduler
from torchhpc.schedulers.kubernetes.rest import KubeAPI
from torchhpc.schedulers.kubernetes.trainjob import status_from_trainjob, trainjob_name

GOLDEN = REPO / "tests" / "golden" / "kubernetes"
IMAGE = "nvcr.io/nvidia/pytorch:24.01-py3"


def spec(**kw: Any) -> JobSpec:
    base: dict[str, Any] = dict(
        entrypoint=Entrypoint.parse(["examples/pi.py", "--n", "1000000"]),
        nodes=2, nproc_per_node=4, gpus_per_node=4, name="pi", output_dir="/work/out", scheduler="kubernetes",
        options=(("image", IMAGE),),
    )
    base.update(kw)
    return JobSpec(**base)


def render(s: JobSpec) -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all(KubernetesScheduler(runner=FakeRunner()).render(s).script or "") if d]
    obj: dict[str, Any] = docs[-1]  # the TrainJob (with --max-restarts its TrainingRuntime comes first)
    return obj


def patch_pod(obj: dict[str, Any]) -> dict[str, Any]:
    """Our runtimePatches entry's pod template (metadata + spec) for the ``node`` job."""
    (patch,) = obj["spec"]["runtimePatches"]
    (job,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert job["name"] == "node"
    pod: dict[str, Any] = job["template"]["spec"]["template"]
    return pod


CASES: dict[str, JobSpec] = {
    "trainjob_cpu": spec(nodes=2, nproc_per_node=2, gpus_per_node=0, cpus_per_task=2),
    "trainjob_2x4_gpu_queue": spec(options=(("image", IMAGE), ("queue", "team-a-queue"), ("namespace", "team-a"))),
    "trainjob_rcp_roce_pvc": spec(
        mem="64G", cpus_per_task=8, network="roce,auto", env=(("NCCL_IB_HCA", "mlx5"), ("NCCL_SOCKET_NTHREADS", "4")),
        options=(("image", "registry.rcp.epfl.ch/meditron-ddx/basic:latest"), ("namespace", "runai-mlo"),
                 ("pvc", "mlo-scratch:/mloscratch"), ("annotation", "k8s.v1.cni.cncf.io/networks=kube-system/roce"),
                 ("extended-resource", "rdma/rdma=1"), ("shm_size", "16G"), ("workdir", "/mloscratch/homes/alice")),
    ),
    "trainjob_time": spec(time="02:00:00", nodes=1, nproc_per_node=8, gpus_per_node=8),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_trainjob(case: str) -> None:
    sub = KubernetesScheduler(runner=FakeRunner()).render(CASES[case])
    check_golden(GOLDEN / f"{case}.yaml", sub.script or "")
    assert sub.argv == ("kubectl", "apply", "-f", "-") and sub.stdin == sub.script
    assert sub.script_path and sub.script_path.endswith(".trainjob.yaml")


@pytest.mark.parametrize("path", sorted(GOLDEN.glob("trainjob_*.yaml")), ids=lambda p: p.name)
def test_every_trainjob_golden_validates(path: Path) -> None:
    obj = yaml.safe_load(path.read_text())
    assert (obj["apiVersion"], obj["kind"]) == ("trainer.kubeflow.org/v1alpha1", "TrainJob")
    validate_trainjob(obj)
    assert type(obj["spec"]["trainer"]["numProcPerNode"]) is int


def test_goldens_cover_the_cases() -> None:
    assert sorted(p.stem for p in GOLDEN.glob("trainjob_*.yaml")) == sorted(CASES)


def test_schema_and_rules_bite() -> None:
    """The validation is not vacuous: a string numProcPerNode, an unknown field, a PET_* env and a bad name fail."""
    obj = render(spec())
    bad = json.loads(json.dumps(obj))
    bad["spec"]["trainer"]["numProcPerNode"] = "auto"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft4Validator(TRAINJOB_SCHEMA).validate(bad)
    typo = json.loads(json.dumps(obj))
    typo["spec"]["trainer"]["numProcsPerNode"] = 4
    with pytest.raises(AssertionError):
        validate_trainjob(typo)
    reserved = json.loads(json.dumps(obj))
    reserved["spec"]["trainer"]["env"] = [{"name": "PET_NNODES", "value": "3"}]
    named = json.loads(json.dumps(obj))
    named["metadata"]["name"] = "1-" + "x" * 70
    assert trainjob_rule_errors(reserved) and len(trainjob_rule_errors(named)) == 2


def test_cli_dry_run_acceptance(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Acceptance: the default --scheduler kubernetes dry run prints a valid TrainJob and says how to check for it."""
    from torchhpc.cli.main import main

    rc = main(["run", "--scheduler", "kubernetes", "--nodes", "2", "--nproc-per-node", "2", "--image", "reg/img:1",
               "--output-dir", str(tmp_path), "--dry-run", "examples/pi.py"])
    out = capsys.readouterr().out
    assert rc == 0
    obj = yaml.safe_load(out.split(" ---\n", 1)[1].split("# --- submit with ---")[0])
    validate_trainjob(obj)
    assert obj["apiVersion"] == "trainer.kubeflow.org/v1alpha1" and obj["kind"] == "TrainJob"
    assert obj["spec"]["trainer"]["numNodes"] == 2 and obj["spec"]["trainer"]["numProcPerNode"] == 2
    assert obj["spec"]["runtimeRef"] == {"name": "torch-distributed"}
    assert "kubectl get crd trainjobs.trainer.kubeflow.org" in out and "kubectl get clustertrainingruntimes" in out


# --- the mapping table (docs/kubernetes.md): every option maps or is refused ---------------------------------

Check = Callable[[dict[str, Any]], Any]


def _resources(obj: dict[str, Any]) -> dict[str, Any]:
    limits: dict[str, Any] = obj["spec"]["trainer"]["resourcesPerNode"]["limits"]
    assert obj["spec"]["trainer"]["resourcesPerNode"]["requests"] == limits
    return limits


def _script(obj: dict[str, Any]) -> str:
    text: str = obj["spec"]["trainer"]["command"][2]
    return text


def _mounts(obj: dict[str, Any]) -> list[dict[str, Any]]:
    mounts: list[dict[str, Any]] = patch_pod(obj)["spec"]["containers"][0]["volumeMounts"]
    return mounts


# row id (as in the docs table) -> (spec keywords, what the TrainJob must show, or None with the refusal's words)
MAPPED: dict[str, tuple[dict[str, Any], Check]] = {
    "--nodes": ({"nodes": 3}, lambda o: o["spec"]["trainer"]["numNodes"] == 3),
    "--nproc-per-node": ({"nproc_per_node": 2}, lambda o: o["spec"]["trainer"]["numProcPerNode"] == 2),
    "--gpus-per-node": ({"gpus_per_node": 2, "nproc_per_node": 2}, lambda o: _resources(o)["nvidia.com/gpu"] == 2),
    "--gpu-kind": ({"gpu_kind": "amd"}, lambda o: _resources(o)["amd.com/gpu"] == 4),
    "--cpus-per-proc": ({"cpus_per_task": 3}, lambda o: _resources(o)["cpu"] == 12),
    "--cpus-per-gpu": ({"cpus_per_gpu": 2}, lambda o: _resources(o)["cpu"] == 8),
    "--mem": ({"mem": "32G"}, lambda o: _resources(o)["memory"] == "32Gi"),
    "--time": ({"time": "1:30:00"}, lambda o: o["spec"]["activeDeadlineSeconds"] == 5400),
    "--name": ({"name": "My_Run.v2"}, lambda o: o["metadata"]["name"] == "my-run-v2"),
    "--env": ({"env": (("A", "1"),)}, lambda o: o["spec"]["trainer"]["env"] == [{"name": "A", "value": "1"}]),
    "--network": ({"network": "roce,auto"},
                  lambda o: "torchhpc net detect --export ${PET_MASTER_ADDR:+--master " in _script(o)),
    "--queue": ({"options": (("image", IMAGE), ("queue", "q1"))},
                lambda o: o["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "q1"),
    "--image": ({"options": (("image", "reg/x:1"),)}, lambda o: o["spec"]["trainer"]["image"] == "reg/x:1"),
    "--container": ({"options": (), "container": ContainerSpec(image="reg/c:2", runtime="docker")},
                    lambda o: o["spec"]["trainer"]["image"] == "reg/c:2"),
    "--bind": ({"container": ContainerSpec(image="reg/c:2", runtime="docker", binds=("data:/data:ro",))},
               lambda o: {"name": "pvc-0", "mountPath": "/data", "readOnly": True} in _mounts(o)
               and {"name": "pvc-0", "persistentVolumeClaim": {"claimName": "data", "readOnly": True}}
               in patch_pod(o)["spec"]["volumes"]),
    "program arguments": ({"entrypoint": Entrypoint.parse(["t.py", "--lr", "0.1"])},
                          lambda o: o["spec"]["trainer"]["command"][3:] == ["torchhpc-pod", "--lr", "0.1"]),
    "setup lines": ({"setup": ("source /opt/env.sh",)}, lambda o: "\nsource /opt/env.sh\nexec " in _script(o)),
    "api": ({"options": (("image", IMAGE), ("api", "trainjob"))}, lambda o: o["kind"] == "TrainJob"),
    "runtime": ({"options": (("image", IMAGE), ("runtime", "torch-cuda-251"))},
                lambda o: o["spec"]["runtimeRef"] == {"name": "torch-cuda-251"}),
    "namespace": ({"options": (("image", IMAGE), ("namespace", "ml"))}, lambda o: o["metadata"]["namespace"] == "ml"),
    "pvc": ({"options": (("image", IMAGE), ("pvc", "scratch:/s"))},
            lambda o: {"name": "pvc-0", "mountPath": "/s"} in _mounts(o)),
    "bind": ({"options": (("image", IMAGE), ("bind", "scratch:/s"))},
             lambda o: {"name": "pvc-0", "mountPath": "/s"} in _mounts(o)),
    "rdma": ({"options": (("image", IMAGE), ("rdma", "kube-system/roce"))},
             lambda o: patch_pod(o)["metadata"]["annotations"] == {"k8s.v1.cni.cncf.io/networks": "kube-system/roce"}
             and _resources(o)["rdma/rdma"] == 1),
    "rdma_resource": ({"options": (("image", IMAGE), ("rdma", "n"), ("rdma_resource", "rdma/roce=2"))},
                      lambda o: _resources(o)["rdma/roce"] == 2),
    "annotation": ({"options": (("image", IMAGE), ("annotation", "a.b/c=d"))},
                   lambda o: patch_pod(o)["metadata"]["annotations"] == {"a.b/c": "d"}),
    "extended_resource": ({"options": (("image", IMAGE), ("extended_resource", "x.io/fpga=2"))},
                          lambda o: _resources(o)["x.io/fpga"] == 2),
    "node_selector": ({"options": (("image", IMAGE), ("node_selector", "gpu=a100,zone=z1"))},
                      lambda o: patch_pod(o)["spec"]["nodeSelector"] == {"gpu": "a100", "zone": "z1"}),
    "toleration": ({"options": (("image", IMAGE), ("toleration", "nvidia.com/gpu:NoSchedule,pool=ml"))},
                   lambda o: patch_pod(o)["spec"]["tolerations"] == [
                       {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                       {"key": "pool", "operator": "Equal", "value": "ml"}]),
    "large_shm": ({"options": (("image", IMAGE), ("large_shm", "1"))},
                  lambda o: {"name": "dshm", "mountPath": "/dev/shm"} in _mounts(o)),
    "shm_size": ({"options": (("image", IMAGE), ("shm_size", "8G"))},
                 lambda o: {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}}
                 in patch_pod(o)["spec"]["volumes"]),
    "workdir": ({"options": (("image", IMAGE), ("workdir", "/w d"))}, lambda o: "\ncd '/w d'\nexec " in _script(o)),
    "service_account": ({"options": (("image", IMAGE), ("service_account", "trainer"))},
                        lambda o: patch_pod(o)["spec"]["serviceAccountName"] == "trainer"),
    "max_restarts": ({"options": (("image", IMAGE), ("max_restarts", "2"))}, lambda o: "--max-restarts 2" in _script(o)),
    "--max-restarts": ({"max_restarts": 2}, lambda o: o["spec"]["runtimeRef"] == {
        "name": "pi-restarts", "apiGroup": "trainer.kubeflow.org", "kind": "TrainingRuntime"}),
    "boot": ({"options": (("image", IMAGE), ("boot", "inline"))},
             lambda o: "TORCHHPC_BOOT_PY" in o["spec"]["trainer"]["command"][2] and "configMap" not in str(o)),
}
REFUSED: dict[str, tuple[dict[str, Any], str]] = {
    "--launcher": ({"launcher": "mpirun"}, "starts torchrun in each pod"),
    "--launcher srun": ({"launcher": "srun"}, "starts torchrun in each pod"),
    "--name (unfixable)": ({"name": "___"}, "no letter or digit"),
    "--env PET_*": ({"env": (("PET_NNODES", "3"),)}, "belong to the Kubeflow Trainer controller"),
    "--array": ({"array": "0-3"}, "array"),
    "--after-ok": ({"after": (Dependency("ok", "train-1"),)}, "cannot hold a job until another ends"),
    "--requeue": ({"requeue": True}, "cannot requeue"),
    "--spares": ({"spares": 1}, "--spares 1"),
    "--min-nodes": ({"nodes": 3, "min_nodes": 2, "max_restarts": 1}, "--min-nodes 2"),
    "--signal-before": ({"signal_before": 60, "time": "1:00:00"}, "no TrainJob equivalent"),
    "--container-env": ({"container": ContainerSpec(image="reg/c:2", runtime="docker", env=("HOME",))},
                        "inherits nothing"),
    "--bind HOST:PATH": ({"options": (("image", IMAGE), ("bind", "/data:/data"))}, "no pod can mount"),
    "restart_policy": ({"options": (("image", IMAGE), ("restart_policy", "OnFailure"))}, "no TrainJob field"),
    "backoff_limit": ({"options": (("image", IMAGE), ("backoff_limit", "2"))}, "no TrainJob field"),
    "image_pull_policy": ({"options": (("image", IMAGE), ("image_pull_policy", "Always"))}, "no TrainJob field"),
    "module entrypoint": ({"entrypoint": Entrypoint.parse([], module="pkg.train")}, "runs a Python script"),
}
# Options that choose how we talk to the cluster (they shape no object): tested by the lifecycle tests below.
TRANSPORT = {"transport", "api_server", "token_file", "ca_file"}


@pytest.mark.parametrize("row", sorted(MAPPED))
def test_option_maps(row: str) -> None:
    kw, check = MAPPED[row]
    obj = render(spec(**kw))
    validate_trainjob(obj)
    assert check(obj), row


@pytest.mark.parametrize("row", sorted(REFUSED))
def test_option_refused(row: str) -> None:
    kw, words = REFUSED[row]
    with pytest.raises(SpecError) as info:
        KubernetesScheduler(runner=FakeRunner()).render(spec(**kw))
    assert words in str(info.value)
    assert info.value.hint, "a refusal says what to do instead"


def test_mapping_table_is_complete_and_documented() -> None:
    """Nothing dropped: every --opt and every JobSpec field has a row here, and every row is in the docs table."""
    rows = set(MAPPED) | set(REFUSED)
    same_as_flag = {"image": "--image", "queue": "--queue"}  # --opt image=/queue= are what the flags set
    assert {same_as_flag.get(o, o) for o in KubernetesScheduler.OPTIONS} - TRANSPORT <= rows
    field_rows = {
        "entrypoint": "program arguments", "nodes": "--nodes", "nproc_per_node": "--nproc-per-node",
        "gpus_per_node": "--gpus-per-node", "gpu_kind": "--gpu-kind", "cpus_per_task": "--cpus-per-proc",
        "cpus_per_gpu": "--cpus-per-gpu", "mem": "--mem", "time": "--time", "name": "--name", "env": "--env",
        "launcher": "--launcher", "container": "--container", "options": "api", "network": "--network",
        "setup": "setup lines", "signal_before": "--signal-before", "requeue": "--requeue", "array": "--array",
        "after": "--after-ok", "spares": "--spares", "max_restarts": "--max-restarts", "min_nodes": "--min-nodes",
    }
    # hang_timeout: the watch of a client that follows the job (--wait), nothing in the manifest
    # max_no_progress, checkpoint_dir, on_restart_append: the in-allocation supervisor's, no manifest field
    implied = {"output_dir", "scheduler", "ntasks_per_node", "max_timeout_requeues", "array_params", "hang_timeout",
               "max_no_progress", "checkpoint_dir", "on_restart_append"}
    assert {f.name for f in dataclasses.fields(JobSpec)} == set(field_rows) | implied
    assert set(field_rows.values()) <= rows
    doc = (REPO / "docs" / "kubernetes.md").read_text()
    table = doc.split("<!-- trainjob-mapping -->")[1]
    documented = {m.group(1) for m in re.finditer(r"^\| `?([^`|]+?)`? \|", table, re.M)}
    assert rows <= documented, sorted(rows - documented)


def test_names_are_rfc1035() -> None:
    assert trainjob_name("pi") == "pi"
    assert trainjob_name("1 Job") == "job-1-job"
    assert trainjob_name("a" * 80) == "a" * 63
    assert trainjob_name("x" * 62 + "-yz") == "x" * 62  # cut at 63, no trailing '-'
    for bad in ("___", "训练", "--"):
        with pytest.raises(SpecError):
            trainjob_name(bad)


# --- the pod command, under the variables the torch plugin injects ----------------------------------------


def test_pod_command_runs_in_bash(tmp_path: Path, hostile: str) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "python"
    fake.write_text("#!/usr/bin/env python3\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    fake.chmod(0o755)
    command = render(spec(entrypoint=Entrypoint.parse(["pi.py", hostile, "-v"])))["spec"]["trainer"]["command"]
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "PET_NNODES": "2", "PET_NPROC_PER_NODE": "4",
           "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "pi-node-0-0.pi", "PET_MASTER_PORT": "29500"}
    r = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    argv = json.loads(r.stdout)
    assert argv[argv.index("--nnodes") + 1] == "2"
    assert argv[argv.index("--node-rank") + 1] == "1"
    assert argv[argv.index("--master-addr") + 1] == "pi-node-0-0.pi"
    assert argv[argv.index("--master-port") + 1] == "29500"
    assert argv[-3:] == ["pi.py", hostile, "-v"]
    assert not list(tmp_path.glob("pwned*"))


def test_env_explain_in_a_trainjob_pod(tmp_path: Path) -> None:
    """Acceptance: `torchhpc env --explain` with the PET_* variables of node 1 of a 2-node TrainJob."""
    pod = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO / "src"), "HOME": str(tmp_path),
           "KUBERNETES_SERVICE_HOST": "10.96.0.1", "PET_NNODES": "2", "PET_NPROC_PER_NODE": "1",
           "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "pi-node-0-0.pi", "PET_MASTER_PORT": "29500"}
    r = subprocess.run([sys.executable, "-m", "torchhpc", "env", "--explain"], capture_output=True, text=True, env=pod)
    assert r.returncode == 0, r.stderr
    chosen = next(line for line in r.stdout.splitlines() if " chosen " in line)
    assert "trainjob" in chosen and "Kubeflow Trainer v2 TrainJob pod" in chosen
    assert "gives   rank 1/2, local 0/1, node 1/2, master pi-node-0-0.pi:29500" in r.stdout
    # Four processes per node: the pod's own shell is no rank, but the answer still names its place.
    r = subprocess.run([sys.executable, "-m", "torchhpc", "env", "--explain"], capture_output=True, text=True,
                       env={**pod, "PET_NPROC_PER_NODE": "4"})
    assert r.returncode != 0
    assert "node 1 of 2, 4 processes per node (world size 8), master pi-node-0-0.pi:29500" in r.stdout + r.stderr


# --- the lifecycle --------------------------------------------------------------------------------------------


def test_status_from_conditions() -> None:
    def job(*conds: tuple[str, str, str], active: int = 0) -> dict[str, Any]:
        return {"metadata": {"name": "pi"}, "status": {
            "conditions": [{"type": t, "status": s, "reason": r, "message": f"{t} {r}"} for t, s, r in conds],
            "jobsStatus": [{"name": "node", "active": active, "ready": 0, "succeeded": 0, "failed": 0}]}}

    assert status_from_trainjob("pi", {"metadata": {"name": "pi"}}).state == "PENDING"
    assert status_from_trainjob("pi", job()).state == "PENDING"
    assert status_from_trainjob("pi", job(active=2)).state == "RUNNING"
    held = status_from_trainjob("pi", job(("Suspended", "True", "Suspended")))
    assert held.state == "SUSPENDED" and not held.terminal
    resumed = status_from_trainjob("pi", job(("Suspended", "False", "Resumed"), active=2))
    assert resumed.state == "RUNNING"
    done = status_from_trainjob("pi", job(("Suspended", "False", "Resumed"), ("Complete", "True", "JobSetCompleted")))
    assert (done.state, done.exit_code, done.ok) == ("COMPLETED", 0, True)
    failed = status_from_trainjob("pi", job(("Failed", "True", "JobSetFailed")))
    assert (failed.state, failed.exit_code) == ("FAILED", 1) and "JobSetFailed" in failed.reason
    late = status_from_trainjob("pi", job(("Failed", "True", "DeadlineExceeded")))
    assert late.state == "TIMEOUT" and late.terminal and "DeadlineExceeded" in late.reason


def test_submit_status_logs_cancel_over_http(fake_api: tuple[FakeKubeAPI, Path], tmp_path: Path) -> None:
    """Acceptance: submit, status to Complete, logs of one rank's pod, list, cancel, through the fake API server."""
    api, token = fake_api
    opts = (("image", IMAGE), ("namespace", "team-a"), ("queue", "q"), ("api_server", api.url), ("token_file", str(token)))
    sched = KubernetesScheduler(runner=FakeRunner(present=set()))  # no kubectl: the HTTP path
    job = sched.submit(spec(options=opts, output_dir=str(tmp_path / "out")))
    assert job == "pi" and api.jobs[("team-a", "pi")]["kind"] == "TrainJob"
    assert ("POST", "/apis/trainer.kubeflow.org/v1alpha1/namespaces/team-a/trainjobs") in api.requests
    assert (tmp_path / "out" / "pi.trainjob.yaml").exists()
    assert sched.status(job).state == "PENDING"
    api.jobs[("team-a", "pi")]["status"] = {"jobsStatus": [{"name": "node", "active": 2}]}
    assert sched.status(job).state == "RUNNING"
    api.jobs[("team-a", "pi")]["status"]["conditions"] = [{"type": "Complete", "status": "True", "reason": "Done"}]
    assert sched.wait(job, poll=0.01).state == "COMPLETED"
    assert sched.status("team-a/pi").state == "COMPLETED"
    pods = sched.pods(job)
    assert [p.rsplit("-", 1)[0] for p in pods] == ["pi-node-0-0", "pi-node-0-1"]
    assert sched.logs(job, rank=5) == f"log of {pods[1]} (node)\n"  # rank 5 of 4 per node: node 1
    assert sched.logs(job, rank=3) == f"log of {pods[0]} (node)\n"
    assert sched.logs(job) == "".join(f"==> {p} <==\nlog of {p} (node)\n" for p in pods)
    with pytest.raises(SchedulerError, match="rank 9"):
        sched.logs(job, rank=9)
    listed = sched.list_jobs()
    assert [(s.job_id, s.state) for s in listed] == [("team-a/pi", "COMPLETED")]
    with pytest.raises(SchedulerError, match="409"):
        sched.submit(spec(options=opts, output_dir=str(tmp_path / "out")))
    sched.cancel(job)
    assert ("team-a", "pi") not in api.jobs
    assert ("DELETE", "/apis/trainer.kubeflow.org/v1alpha1/namespaces/team-a/trainjobs/pi") in api.requests
    with pytest.raises(SchedulerError, match="404"):
        sched.status(job)


def test_fake_server_refuses_what_the_cluster_would(fake_api: tuple[FakeKubeAPI, Path]) -> None:
    """The fake's checks bite on the wire too: a reserved env and a string numProcPerNode are 422s."""
    api, _ = fake_api
    client = KubeAPI(api.url, FakeKubeAPI.TOKEN)
    obj = render(spec())
    for mutate in (lambda o: o["spec"]["trainer"].update(env=[{"name": "PET_MASTER_PORT", "value": "1"}]),
                   lambda o: o["spec"]["trainer"].update(numProcPerNode="auto"),
                   lambda o: o["metadata"].update(name="Pi")):
        bad = json.loads(json.dumps(obj))
        mutate(bad)
        with pytest.raises(SchedulerError, match="422"):
            client.request("POST", "/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs", bad)
    assert not api.jobs


def test_kubectl_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHHPC_STATE_DIR", str(tmp_path))
    got = {"kind": "TrainJob", "apiVersion": "trainer.kubeflow.org/v1alpha1", "metadata": {"name": "pi"},
           "status": {"conditions": [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}]}}
    pods = {"items": [{"metadata": {"name": f"pi-node-0-{i}-ab{i}cd", "creationTimestamp": "2026-08-01T10:00:00Z",
                                    "labels": {"batch.kubernetes.io/job-completion-index": str(i)}}} for i in (1, 0)]}

    def kubectl(argv: list[str], _stdin: str | None) -> str:
        if argv[1:3] == ["get", "pods"]:
            return json.dumps(pods)
        if argv[1] == "get" and "-l" in argv:
            return json.dumps({"items": [got]})
        return json.dumps(got) if argv[1] == "get" else "ok\n"

    runner = FakeRunner(responses={"kubectl": kubectl})
    sched = KubernetesScheduler(runner=runner)
    job = sched.submit(spec(options=(("image", IMAGE), ("namespace", "ml")), output_dir=str(tmp_path)))
    assert runner.calls[0][0] == ["kubectl", "create", "-f", "-"]  # the boot ConfigMap, before the job
    argv, stdin = runner.calls[1]
    assert argv == ["kubectl", "apply", "-f", "-"] and stdin is not None
    validate_trainjob(yaml.safe_load(stdin))
    st = sched.status(job)
    assert (st.state, st.reason) == ("TIMEOUT", "DeadlineExceeded")
    assert runner.calls[-1][0] == ["kubectl", "get", "trainjobs.trainer.kubeflow.org", "pi", "-n", "ml", "-o", "json"]
    sched.logs(job, rank=4)
    assert ["kubectl", "get", "pods", "-n", "ml", "-l", "jobset.sigs.k8s.io/jobset-name=pi", "-o", "json"] in [
        c[0] for c in runner.calls]
    assert runner.calls[-1][0] == ["kubectl", "logs", "pi-node-0-1-ab1cd", "-n", "ml", "-c", "node"]
    assert [s.job_id for s in sched.list_jobs()] == ["ml/pi"]
    assert runner.calls[-1][0][:3] == ["kubectl", "get", "trainjobs.trainer.kubeflow.org"]
    sched.cancel(job)
    assert runner.calls[-1][0] == ["kubectl", "delete", "trainjobs.trainer.kubeflow.org", "pi", "-n", "ml"]


def test_profile_keys_choose_api_and_runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A site profile (the user's profiles.toml) can keep PyTorchJob, or name its ClusterTrainingRuntime."""
    from torchhpc.cli.main import main

    (tmp_path / "torchhpc").mkdir()
    (tmp_path / "torchhpc" / "profiles.toml").write_text(
        '[oldkf]\nscheduler = "kubernetes"\noptions = { api = "pytorchjob" }\n\n'
        '[newkf]\nscheduler = "kubernetes"\noptions = { runtime = "torch-cuda-251", queue = "lq" }\n')
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(REPO)
    argv = ["run", "--image", "reg/img:1", "--output-dir", str(tmp_path), "--dry-run", "examples/pi.py"]
    assert main(["run", "--profile", "oldkf", *argv[1:]]) == 0
    out = capsys.readouterr().out
    assert "kind: PyTorchJob" in out and "kubectl get crd pytorchjobs.kubeflow.org" in out
    assert main(["run", "--profile", "newkf", *argv[1:]]) == 0
    obj = yaml.safe_load(capsys.readouterr().out.split(" ---\n", 1)[1].split("# --- submit with ---")[0])
    validate_trainjob(obj)
    assert obj["spec"]["runtimeRef"] == {"name": "torch-cuda-251"}
    assert obj["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "lq"


def test_no_manifest_line_is_over_200_characters() -> None:
    """Issue 43: a manifest a person can read. The pod script (boot file included) is a YAML literal block,
    the torchrun line is wrapped; every TrainJob and PyTorchJob render of the golden cases, also with --network auto;
    ReplicatedJob names stay within Trainer v2.4.0's 20 characters for runtimes."""
    from tests.unit.test_kubernetes import CASES as PYTORCHJOB_CASES

    specs = [*CASES.values(), *PYTORCHJOB_CASES.values(), spec(network="auto")]
    for s in specs:
        text = KubernetesScheduler(runner=FakeRunner()).render(s).script or ""
        longest = max(text.splitlines(), key=len)
        assert len(longest) <= 200, longest[:120]
        assert re.search(r"\n +- \|-?\n +if \[", text), "the pod script is a literal block"
        obj = yaml.safe_load(text)
        for patch in obj.get("spec", {}).get("runtimePatches", []):
            for job in patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]:
                assert len(job["name"]) <= 20, job["name"]


@pytest.mark.parametrize("max_restarts", [0, 3])
def test_every_rendered_line_is_within_160_characters(max_restarts: int) -> None:
    """The TrainJob (and its TrainingRuntime) with the README's registry image, a long program line and the
    boot file inline: every line of the YAML within 160 characters, as the batch scripts' (issue 69)."""
    s = spec(options=(("image", "nvcr.io/nvidia/pytorch:24.03-py3"),), max_restarts=max_restarts,
             entrypoint=Entrypoint.parse(["examples/pi.py", *(f"--option-{i}=value-{i}" for i in range(12))]))
    text = KubernetesScheduler(runner=FakeRunner()).render(s).script or ""
    assert text and max(map(len, text.splitlines())) <= 160, max(text.splitlines(), key=len)
