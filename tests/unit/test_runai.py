"""RunAI backend, ``--opt cli=v1``: the seed's ``runai submit-dist pytorch`` command, its two quoting layers, and the CLI calls.

What is real: the rendered command line is parsed by a real bash, and the
command after ``--`` is parsed again by a real ``sh`` and run by a real
``bash -c``, with a stand-in ``python`` that records its argv. What is a model:
RunAI itself. No RunAI cluster is reachable here; following seed 004 (the
"double double quotes" warning), we model RunAI as joining the words after
``--`` with spaces and handing that line to the pod's shell. ``runai
describe/logs/delete`` answer through a FakeRunner with text in the shape of
RunAI CLI v2's output.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.fakes import FakeRunner
from tests.unit.test_pbs import check_golden
from torchhpc.core.shell import join
from torchhpc.core.spec import ContainerSpec, Entrypoint, JobSpec
from torchhpc.errors import SchedulerError, SpecError
from torchhpc.schedulers import get_scheduler
from torchhpc.schedulers.runai.runai import RunAIScheduler, k8s_name, parse_describe, runai_state

GOLDEN = REPO / "tests" / "golden" / "runai"
IMAGE = "registry.rcp.epfl.ch/meditron-ddx/basic:latest-solergib"


def spec(**kw: object) -> JobSpec:
    base: dict[str, object] = dict(
        entrypoint=Entrypoint.parse(["examples/pi.py"]),
        nodes=2,
        nproc_per_node=4,
        gpus_per_node=4,
        name="my_first_distributed_app",
        scheduler="runai",
        options=(("image", IMAGE),),
    )
    base.update(kw)
    if not any(k == "cli" for k, _ in base["options"]):  # type: ignore[attr-defined]
        base["options"] = (*base["options"], ("cli", "v1"))  # type: ignore[misc]  # this file: CLI v1
    return JobSpec(**base)  # type: ignore[arg-type]


SEED_OPTS = (
    ("image", IMAGE),
    ("pvc", "mlo-scratch:/mloscratch"),
    ("rdma", "kube-system/roce"),
    ("log_dir", "/mloscratch/homes/solergib/reports"),
)
CASES: dict[str, JobSpec] = {
    "pi_2x4": spec(),
    "seed_rcp_rdma": spec(
        gpus_per_node=0,
        nproc_per_node=20,
        options=SEED_OPTS,
        env=(("PATH_TO_ROOT_REPO", "/mloscratch/homes/solergib/getting-started"), ("NCCL_IB_HCA", "mlx5")),
    ),
    "four_pods_project": spec(nodes=4, options=(("image", IMAGE), ("project", "mlo-alice"), ("large_shm", "0"))),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_command(case: str) -> None:
    sub = RunAIScheduler(runner=FakeRunner()).render(CASES[case])
    check_golden(GOLDEN / f"{case}.sh", "#!/bin/bash\n" + join(sub.argv) + "\n")


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_commands_parse(case: str) -> None:
    subprocess.run(["bash", "-n", str(GOLDEN / f"{case}.sh")], check=True)


def test_workers_is_nodes_minus_one() -> None:
    argv = RunAIScheduler(runner=FakeRunner()).submit_argv(spec(nodes=2, gpus_per_node=4))
    assert argv[:3] == ["runai", "submit-dist", "pytorch"]
    assert argv[argv.index("--workers") + 1] == "1"
    assert argv[argv.index("--gpu") + 1] == "4"
    assert "--large-shm" in argv
    assert argv[argv.index("--") + 1 : argv.index("--") + 3] == ["bash", "-c"]
    one = RunAIScheduler(runner=FakeRunner()).submit_argv(spec(nodes=1))
    assert one[one.index("--workers") + 1] == "0"


def test_seed_shape_double_double_quotes() -> None:
    """The printed line ends like the seed's: -- bash -c '"...\\$VAR..."'."""
    line = join(RunAIScheduler(runner=FakeRunner()).submit_argv(CASES["seed_rcp_rdma"]))
    assert "--annotation k8s.v1.cni.cncf.io/networks=kube-system/roce --extended-resource rdma/rdma=1" in line
    assert "--pvc mlo-scratch:/mloscratch" in line and "-e PATH_TO_ROOT_REPO=" in line
    tail = line.split(" -- bash -c ", 1)[1]
    assert tail.startswith("'\"") and tail.endswith("\"'")
    assert '--nnodes \\"\\$WORLD_SIZE\\"' in tail and '--node-rank \\"\\$RANK\\"' in tail
    assert "$" not in tail.replace("\\$", "")  # nothing expands before the pod


def _fake_bin(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    runai = bin_dir / "runai"
    runai.write_text(
        "#!/usr/bin/env python3\nimport json, os, sys\n"
        "open(os.environ['RUNAI_ARGV'], 'w').write(json.dumps(sys.argv[1:]))\n"
    )
    python = bin_dir / "python"
    python.write_text(
        "#!/usr/bin/env python3\nimport json, os, sys\n"
        "print(json.dumps({'argv': sys.argv[1:], 'cwd': os.getcwd()}))\n"
    )
    runai.chmod(0o755)
    python.chmod(0o755)
    return bin_dir


def _through_both_layers(tmp_path: Path, s: JobSpec, pod_env: dict[str, str]) -> tuple[list[str], str]:
    """Run the rendered line in bash (fake runai), then the modelled RunAI layer: sh -c "words after --"."""
    bin_dir = _fake_bin(tmp_path)
    argv_file = tmp_path / "argv.json"
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "RUNAI_ARGV": str(argv_file), "HOME": str(tmp_path)}
    line = join(RunAIScheduler(runner=FakeRunner()).submit_argv(s))
    subprocess.run(["bash", "-c", line], check=True, env=env, cwd=tmp_path)
    runai_argv: list[str] = json.loads(argv_file.read_text())
    after = runai_argv[runai_argv.index("--") + 1 :]
    pod = subprocess.run(
        ["sh", "-c", " ".join(after)],
        capture_output=True, text=True, env={**env, **pod_env}, cwd=tmp_path,
    )
    assert pod.returncode == 0, pod.stderr
    return runai_argv, pod.stdout


POD_ENV = {"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "23456", "JOB_UUID": "u-42"}


def test_pod_sees_pod_variables_and_exact_args(tmp_path: Path, hostile: str) -> None:
    s = spec(entrypoint=Entrypoint.parse(["examples/pi.py", hostile, "--x"]), env=(("MSG", hostile),))
    runai_argv, out = _through_both_layers(tmp_path, s, POD_ENV)
    assert f"MSG={hostile}" in runai_argv  # -e reaches runai verbatim (one shell layer only)
    got = json.loads(out)["argv"]
    assert got == [
        "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "4", "--node-rank", "1",
        "--master-addr", "10.1.2.3", "--master-port", "23456", "--max-restarts", "0", "--tee", "3",
        "examples/pi.py", hostile, "--x",
    ]
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "pwned2").exists()


def test_log_dir_file_per_pod(tmp_path: Path) -> None:
    logs = tmp_path / "reports dir"
    s = spec(options=(("image", IMAGE), ("log_dir", str(logs)), ("workdir", str(tmp_path))))
    _, out = _through_both_layers(tmp_path, s, POD_ENV)
    assert out == ""
    record = json.loads((logs / "u-42-pod1.log").read_text())
    assert record["argv"][record["argv"].index("--node-rank") + 1] == "1"
    assert record["cwd"] == str(tmp_path)


def test_image_from_container_and_errors() -> None:
    s = spec(options=(), container=ContainerSpec(image="nvcr.io/nvidia/pytorch:24.01-py3", runtime="docker"))
    argv = RunAIScheduler(runner=FakeRunner()).submit_argv(s)
    assert argv[argv.index("--image") + 1] == "nvcr.io/nvidia/pytorch:24.01-py3"
    with pytest.raises(SpecError, match="needs a container image"):
        RunAIScheduler(runner=FakeRunner()).render(spec(options=()))
    with pytest.raises(SpecError, match="unknown runai option"):
        RunAIScheduler(runner=FakeRunner()).render(spec(options=(("image", IMAGE), ("queue", "q"))))
    with pytest.raises(SpecError, match="one pod per node"):
        RunAIScheduler(runner=FakeRunner()).render(spec(launcher="mpirun"))


def test_k8s_names() -> None:
    assert k8s_name("my_first_distributed_app") == "my-first-distributed-app"
    assert k8s_name("1 Job") == "job-1-job"
    assert k8s_name("___") == "job"


DESCRIBE = """Name: pi
Namespace: runai-mlo-alice
Type: Train (distributed)
Status: {status}
Duration: 3m
GPUs: 4.00
Total Requested GPUs: 8.00
Allocated GPUs: 8.00
Running PODs: 2
Pending PODs: 0
Parallelism: 2
Completions: 2
Succeeded PODs: 0
Failed PODs: 0
Is Distributed Workload: true
Service URLs:
Command: [bash -c "exec python -m torch.distributed.run ..."]

Pods:
POD           STATUS   TYPE   AGE  NODE
pi-master-0   Running  MPI    3m   gpu01/10.0.0.1
pi-worker-0   Running  MPI    3m   gpu02/10.0.0.2
"""


def test_status_logs_cancel_through_the_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHHPC_STATE_DIR", str(tmp_path))
    state = {"status": "Running"}
    runner = FakeRunner(
        responses={"runai": lambda argv, _i: DESCRIBE.format(**state) if argv[1] == "describe" else "log line\n"}
    )
    sched = RunAIScheduler(runner=runner)
    s = spec(options=(("image", IMAGE), ("project", "mlo-alice")), name="pi")
    job = sched.submit(s)
    assert job == "pi" and runner.calls[0][0][:3] == ["runai", "submit-dist", "pytorch"]
    st = sched.status(job)
    assert (st.state, st.elapsed) == ("RUNNING", "3m")
    assert runner.calls[-1][0] == ["runai", "describe", "job", "pi", "-p", "mlo-alice"]
    state["status"] = "Succeeded"
    assert sched.wait(job, poll=0.01).state == "COMPLETED"
    assert sched.logs(job, rank=5) == "log line\n"
    assert runner.calls[-1][0] == ["runai", "logs", "pi", "-p", "mlo-alice", "--pod", "pi-worker-0"]
    sched.cancel(job)
    assert runner.calls[-1][0] == ["runai", "delete", "job", "pi", "-p", "mlo-alice"]


def test_describe_parsing_and_states() -> None:
    assert parse_describe("pi", DESCRIBE.format(status="Pending")).state == "PENDING"
    assert parse_describe("pi", DESCRIBE.format(status="Failed")).state == "FAILED"
    assert runai_state("ContainerCreating") == "PENDING" and runai_state("TimedOut") == "TIMEOUT"
    with pytest.raises(SchedulerError, match="no Status line"):
        parse_describe("pi", "Error: something\n")
    missing = FakeRunner(responses={"runai": (1, "", "Error: job pi not found in project x")})
    with pytest.raises(SchedulerError, match="not found"):
        RunAIScheduler(runner=missing).status("pi")


def test_registered() -> None:
    assert isinstance(get_scheduler("runai", runner=FakeRunner()), RunAIScheduler)


def test_profile_style_option_names() -> None:
    """The rcp profile writes RunAI's own flag names (``large-shm``, ``extended-resource``): accepted as keys."""
    s = spec(options=(
        ("image", IMAGE),
        ("annotation", "k8s.v1.cni.cncf.io/networks=kube-system/roce"),
        ("extended-resource", "rdma/rdma=1"),
        ("large-shm", "true"),
    ))
    line = join(RunAIScheduler(runner=FakeRunner()).submit_argv(s))
    assert "--annotation k8s.v1.cni.cncf.io/networks=kube-system/roce --extended-resource rdma/rdma=1" in line
    assert "--large-shm" in line
    with pytest.raises(SpecError, match="NAME=VALUE"):
        RunAIScheduler(runner=FakeRunner()).submit_argv(spec(options=(("image", IMAGE), ("annotation", "x"))))


def test_cli_dry_run_prints_seed_shape(capsys: pytest.CaptureFixture[str]) -> None:
    """Acceptance: `torchhpc run --scheduler runai --nodes 2 --gpus-per-node 4 --image ... --dry-run`."""
    from torchhpc.cli.main import main

    rc = main(["run", "--scheduler", "runai", "--nodes", "2", "--gpus-per-node", "4", "--image", IMAGE,
               "--opt", "cli=v1", "--dry-run", "examples/pi.py"])
    out = capsys.readouterr().out
    assert rc == 0
    assert f"runai submit-dist pytorch --name pi --image {IMAGE} --workers 1 --gpu 4" in out
    assert " -- bash -c '\"exec python -m torch.distributed.run --nnodes \\\"\\$WORLD_SIZE\\\"" in out
