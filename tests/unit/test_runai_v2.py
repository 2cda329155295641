"""RunAI backend, default render: the current CLI's ``runai training pytorch submit NAME``.

What is real: the rendered line is parsed by a real bash that runs a stand-in
``runai`` recording its argv; the words after ``--command --`` are then run as
the container's argv (no second shell: the CLI reference's own examples quote
``--command -- /bin/bash -c "..."`` once) with the pod variables RunAI sets and
a stand-in ``python``. What is a model: RunAI itself (no cluster reachable
here); flag names follow the Run:ai CLI reference (``--workers``,
``--gpu-devices-request``/``--master-gpu-devices-request``, ``--existing-pvc
claimname=...,path=...``, ``-e``/``--master-environment-variable``,
``--preemptibility``); ``describe/logs/delete`` answer through a FakeRunner.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tests.fakes import FakeRunner
from tests.unit.test_pbs import check_golden
from torchhpc.core.shell import join
from torchhpc.core.spec import Entrypoint, JobSpec
from torchhpc.errors import SpecError
from torchhpc.schedulers.runai.runai import RunAIScheduler

GOLDEN = REPO / "tests" / "golden" / "runai"
IMAGE = "registry.rcp.epfl.ch/meditron-ddx/basic:latest-solergib"


def spec(**kw: Any) -> JobSpec:
    base: dict[str, Any] = dict(
        entrypoint=Entrypoint.parse(["examples/pi.py"]), nodes=2, nproc_per_node=4, gpus_per_node=4,
        name="my_first_distributed_app", scheduler="runai", options=(("image", IMAGE),),
    )
    base.update(kw)
    return JobSpec(**base)


def argv_of(s: JobSpec) -> list[str]:
    return RunAIScheduler(runner=FakeRunner()).submit_argv(s)


def after(argv: list[str], flag: str) -> list[str]:
    """Every value given to ``flag``."""
    return [argv[i + 1] for i, word in enumerate(argv) if word == flag]


CASES: dict[str, JobSpec] = {
    "v2_pi_2x4": spec(),
    "v2_rcp_roce_pvc": spec(
        nodes=3, cpus_per_task=4, mem="64G", env=(("NCCL_IB_HCA", "mlx5"),),
        options=(("image", IMAGE), ("project", "mlo-alice"), ("pvc", "mlo-scratch:/mloscratch"),
                 ("rdma", "kube-system/roce"), ("preemptibility", "non-preemptible"),
                 ("log_dir", "/mloscratch/homes/alice/reports")),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_command(case: str) -> None:
    sub = RunAIScheduler(runner=FakeRunner()).render(CASES[case])
    check_golden(GOLDEN / f"{case}.sh", "#!/bin/bash\n" + join(sub.argv) + "\n")
    subprocess.run(["bash", "-n", str(GOLDEN / f"{case}.sh")], check=True)


def test_workers_and_the_masters_own_flags() -> None:
    argv = argv_of(CASES["v2_rcp_roce_pvc"])
    assert argv[:5] == ["runai", "training", "pytorch", "submit", "my-first-distributed-app"]
    assert after(argv, "--workers") == ["2"]  # 3 nodes: the master + 2 workers
    assert after(argv, "--gpu-devices-request") == after(argv, "--master-gpu-devices-request") == ["4"]
    assert after(argv, "--cpu-core-request") == after(argv, "--master-cpu-core-request") == ["16"]
    assert after(argv, "--cpu-memory-request") == after(argv, "--master-cpu-memory-request") == ["64G"]
    assert after(argv, "--extended-resource") == after(argv, "--master-extended-resource") == ["rdma/rdma=1"]
    assert after(argv, "--annotation") == ["k8s.v1.cni.cncf.io/networks=kube-system/roce"]
    assert after(argv, "--existing-pvc") == ["claimname=mlo-scratch,path=/mloscratch"]
    assert after(argv, "-e") == after(argv, "--master-environment-variable") == [
        "TORCHHPC_NPROC_PER_NODE=4", "NCCL_IB_HCA=mlx5"]
    assert after(argv, "--preemptibility") == ["non-preemptible"] and after(argv, "-p") == ["mlo-alice"]
    assert "--large-shm" in argv and "--pvc" not in argv and "--gpu" not in argv
    assert argv[argv.index("--command"):argv.index("--command") + 4] == ["--command", "--", "bash", "-c"]
    cpu = argv_of(spec(gpus_per_node=0, nproc_per_node=2))
    assert "--gpu-devices-request" not in cpu and "--master-gpu-devices-request" not in cpu


def test_bind_and_ro_claims() -> None:
    argv = argv_of(spec(options=(("image", IMAGE), ("bind", "data:/data:ro,scratch:/s"))))
    assert after(argv, "--existing-pvc") == ["claimname=data,path=/data,ro", "claimname=scratch,path=/s"]
    with pytest.raises(SpecError, match="no pod can mount"):
        argv_of(spec(options=(("image", IMAGE), ("bind", "/home/me:/w"))))


def test_cli_v1_is_todays_submit_dist() -> None:
    """`--opt cli=v1` gives exactly the seed-shaped v1 golden (tests/unit/test_runai.py renders it too)."""
    v1 = argv_of(spec(options=(("image", IMAGE), ("cli", "v1"))))
    assert "#!/bin/bash\n" + join(v1) + "\n" == (GOLDEN / "pi_2x4.sh").read_text()
    with pytest.raises(SpecError, match="submit-dist"):
        argv_of(spec(options=(("image", IMAGE), ("cli", "v1"), ("preemptibility", "preemptible"))))
    with pytest.raises(SpecError, match="cli"):
        argv_of(spec(options=(("image", IMAGE), ("cli", "v3"))))


def test_rcp_profile_keeps_submit_dist(capsys: pytest.CaptureFixture[str], clean_user_env: None) -> None:
    from torchhpc.cli.main import main

    assert main(["run", "--profile", "rcp", "--image", "reg/img:1", "--dry-run", "examples/pi.py"]) == 0
    assert "runai submit-dist pytorch" in capsys.readouterr().out
    assert main(["run", "--profile", "rcp", "--opt", "cli=v2", "--image", "reg/img:1", "--dry-run",
                 "examples/pi.py"]) == 0
    assert "runai training pytorch submit" in capsys.readouterr().out


def test_cli_dry_run_acceptance(capsys: pytest.CaptureFixture[str], clean_user_env: None) -> None:
    """Acceptance: the default RunAI dry run is the current CLI, --workers nodes-1, the master's GPU request."""
    from torchhpc.cli.main import main

    assert main(["run", "--scheduler", "runai", "--nodes", "4", "--gpus-per-node", "2", "--image", IMAGE,
                 "--dry-run", "examples/pi.py"]) == 0
    out = capsys.readouterr().out
    assert f"runai training pytorch submit pi -i {IMAGE} --workers 3 --gpu-devices-request 2 " \
           "--master-gpu-devices-request 2 " in out
    assert "`runai version`" in out
    assert main(["run", "--scheduler", "runai", "--nodes", "4", "--gpus-per-node", "2", "--image", IMAGE,
                 "--opt", "cli=v1", "--dry-run", "examples/pi.py"]) == 0
    assert f"runai submit-dist pytorch --name pi --image {IMAGE} --workers 3 --gpu 2 " in capsys.readouterr().out


def test_pod_runs_the_command_as_argv(tmp_path: Path, hostile: str) -> None:
    """Through the local bash to a stand-in runai, then the words after --command -- as the container's argv."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("runai", "open(os.environ['RUNAI_ARGV'], 'w').write(json.dumps(sys.argv[1:]))"),
                       ("python", "print(json.dumps(sys.argv[1:]))")):
        (bin_dir / name).write_text(f"#!/usr/bin/env python3\nimport json, os, sys\n{body}\n")
        (bin_dir / name).chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "RUNAI_ARGV": str(tmp_path / "argv.json"), "HOME": str(tmp_path)}
    s = spec(entrypoint=Entrypoint.parse(["examples/pi.py", hostile]), env=(("MSG", hostile),))
    subprocess.run(["bash", "-c", join(argv_of(s))], check=True, env=env, cwd=tmp_path)
    runai_argv: list[str] = json.loads((tmp_path / "argv.json").read_text())
    assert f"MSG={hostile}" in after(runai_argv, "-e")
    container = runai_argv[runai_argv.index("--command") + 2:]
    pod_env = {"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "23456"}
    r = subprocess.run(container, capture_output=True, text=True, env={**env, **pod_env}, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got[got.index("--nnodes") + 1] == "2" and got[got.index("--node-rank") + 1] == "1"
    assert got[got.index("--master-addr") + 1] == "10.1.2.3" and got[-2:] == ["examples/pi.py", hostile]
    assert not list(tmp_path.glob("pwned*"))


def test_lifecycle_uses_the_submitting_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHHPC_STATE_DIR", str(tmp_path))
    runner = FakeRunner(responses={"runai": lambda argv, _i: "Name: pi\nStatus: Running\n" if "describe" in argv else "x\n"})
    sched = RunAIScheduler(runner=runner)
    job = sched.submit(spec(name="pi", options=(("image", IMAGE), ("project", "p1"))))
    assert runner.calls[0][0][:4] == ["runai", "training", "pytorch", "submit"]
    assert sched.status(job).state == "RUNNING"
    assert runner.calls[-1][0] == ["runai", "training", "pytorch", "describe", "pi", "-p", "p1"]
    sched.logs(job, rank=4)
    assert runner.calls[-1][0] == ["runai", "training", "pytorch", "logs", "pi", "-p", "p1", "--pod", "pi-worker-0"]
    sched.cancel(job)
    assert runner.calls[-1][0] == ["runai", "training", "pytorch", "delete", "pi", "-p", "p1"]
    sched.submit(spec(name="old", options=(("image", IMAGE), ("cli", "v1"))))
    sched.cancel("old")
    assert runner.calls[-1][0] == ["runai", "delete", "job", "old"]
