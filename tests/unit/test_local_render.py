"""The local scheduler's pure half: the env contract, geometry checks, the dry-run script."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys

import pytest

from tests.conftest import missing
from torchhpc.core.processes import describe_exit, exit_status
from torchhpc.core.spec import Entrypoint, JobSpec
from torchhpc.errors import JobFailed, SpecError
from torchhpc.launchers.boot import BOOT_DIR
from torchhpc.schedulers import get_scheduler
from torchhpc.schedulers.local.local import LocalScheduler
from torchhpc.schedulers.local.ranks import CONTRACT, PER_RANK, common_env, free_port, new_run_id, rank_env


def spec_for(argv: list[str], **kw: object) -> JobSpec:
    return JobSpec(entrypoint=Entrypoint.parse(argv), **kw)  # type: ignore[arg-type]


def test_registry_loads_local() -> None:
    assert isinstance(get_scheduler("local"), LocalScheduler)


@pytest.mark.parametrize("n", [1, 3, 8])
def test_rank_env_is_torchruns_contract(n: int) -> None:
    spec = spec_for(["train.py"], nproc_per_node=n)
    envs = [rank_env(spec, r, master_addr="127.0.0.1", master_port=1234, run_id="rid") for r in range(n)]
    for r, env in enumerate(envs):
        assert tuple(env) == CONTRACT
        assert env["RANK"] == env["LOCAL_RANK"] == env["ROLE_RANK"] == str(r)
        assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == env["ROLE_WORLD_SIZE"] == str(n)
        assert env["GROUP_RANK"] == "0" and env["GROUP_WORLD_SIZE"] == "1"
        assert env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"] == "1234"
        assert env["TORCHELASTIC_RUN_ID"] == "rid"
        # Workers must create the TCPStore themselves: no agent hosts one.
        assert env["TORCHELASTIC_USE_AGENT_STORE"] == "False"
    # Only the per-rank names differ between ranks.
    if n > 1:
        differing = {k for k in CONTRACT if envs[0][k] != envs[1][k]}
        assert differing == set(PER_RANK)


def test_common_env_unbuffered_threads_and_user_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    env = common_env(spec_for(["t.py"], nproc_per_node=2, env=(("FOO", "a b"),)))
    boot = env.pop("PYTHONPATH")  # the exit cures' boot directory first (tests/unit/test_boot.py)
    assert boot.split(os.pathsep)[0] == BOOT_DIR
    assert env == {"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "FOO": "a b"}
    # One rank keeps every core, as torchrun does; a user's OMP_NUM_THREADS is left alone.
    assert "OMP_NUM_THREADS" not in common_env(spec_for(["t.py"], nproc_per_node=1))
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    assert "OMP_NUM_THREADS" not in common_env(spec_for(["t.py"], nproc_per_node=2))
    # The user's --env wins over our defaults.
    env = common_env(spec_for(["t.py"], nproc_per_node=2, env=(("PYTHONUNBUFFERED", "0"),)))
    assert env["PYTHONUNBUFFERED"] == "0"


def test_render_argv_is_the_worker_command() -> None:
    sub = LocalScheduler().render(spec_for(["examples/pi.py", "--steps", "10"], nproc_per_node=4))
    assert sub.scheduler == "local"
    assert sub.argv == (sys.executable, "examples/pi.py", "--steps", "10")
    cmd = spec_for(["echo", "hi"])
    assert LocalScheduler().render(cmd).argv == ("echo", "hi")


def test_render_script_lists_every_rank() -> None:
    sub = LocalScheduler().render(spec_for(["train.py"], nproc_per_node=3))
    assert sub.script is not None
    rank_lines = [ln for ln in sub.script.splitlines() if ln.startswith("RANK=")]
    assert len(rank_lines) == 3
    for r, line in enumerate(rank_lines):
        assert line.startswith(f"RANK={r} LOCAL_RANK={r} ROLE_RANK={r} setsid ")
        assert line.endswith(" train.py &")
    assert "export WORLD_SIZE=3" in sub.script
    assert "export MASTER_ADDR=127.0.0.1" in sub.script
    text = str(sub)
    assert "free port" in text  # the dry run says where the port comes from


def test_render_fixed_port_and_run_id_from_env() -> None:
    spec = spec_for(
        ["train.py"], nproc_per_node=2, env=(("MASTER_PORT", "29555"), ("TORCHELASTIC_RUN_ID", "abc"))
    )
    sub = LocalScheduler().render(spec)
    assert sub.script is not None
    assert "export MASTER_PORT=29555" in sub.script
    assert "export TORCHELASTIC_RUN_ID=abc" in sub.script
    assert "free port" not in str(sub)


def test_render_fixed_port_from_option() -> None:
    sub = LocalScheduler().render(spec_for(["t.py"], options=(("master_port", "29600"),)))
    assert sub.script is not None and "export MASTER_PORT=29600" in sub.script


def test_bad_port_names_value_and_source() -> None:
    with pytest.raises(SpecError) as e:
        LocalScheduler().render(spec_for(["t.py"], env=(("MASTER_PORT", "http"),)))
    assert "'http'" in str(e.value) and "--env" in str(e.value) and e.value.hint


def test_nodes_must_be_one() -> None:
    with pytest.raises(SpecError) as e:
        LocalScheduler().render(spec_for(["t.py"], nodes=2, nproc_per_node=2))
    assert "--nodes=2" in e.value.message
    assert e.value.hint and "--scheduler slurm" in e.value.hint


@pytest.mark.parametrize("launcher", ["srun", "mpirun"])
def test_other_launchers_rejected(launcher: str) -> None:
    with pytest.raises(SpecError, match=f"--launcher {launcher}"):
        LocalScheduler().render(spec_for(["t.py"], launcher=launcher))


def test_setup_lines_wrap_the_command() -> None:
    sub = LocalScheduler().render(spec_for(["echo", "x"], setup=("export A=1",)))
    assert sub.argv[:2] == ("bash", "-c")
    assert sub.argv[2].splitlines() == ["export A=1", 'exec "$@"']
    assert sub.argv[3:] == ("torchhpc-local", "echo", "x")


def test_dry_run_script_is_valid_bash(hostile: str) -> None:
    spec = spec_for(["prog", hostile], nproc_per_node=2, env=(("VAL", hostile),))
    sub = LocalScheduler().render(spec)
    assert sub.script is not None
    cp = subprocess.run(["bash", "-n"], input=sub.script, text=True, capture_output=True)
    assert cp.returncode == 0, cp.stderr


def test_dry_run_script_passes_shellcheck() -> None:
    if shutil.which("shellcheck") is None:
        missing("shellcheck not installed (scripts/test.sh installs it)")
    # SC2016 (no expansion in single quotes) is the point of quoting "$HOME", so it is excluded.
    sub = LocalScheduler().render(spec_for(["t.py", "$HOME", "a b"], nproc_per_node=2, env=(("X", "$(y)"),)))
    assert sub.script is not None
    cp = subprocess.run(["shellcheck", "-s", "bash", "-e", "SC2016", "-"], input=sub.script, text=True, capture_output=True)
    assert cp.returncode == 0, cp.stdout


def test_describe_exit_codes_and_signals() -> None:
    assert describe_exit(1, 3) == "rank 1 exited with code 3"
    assert describe_exit(2, -signal.SIGKILL) == "rank 2 was killed by signal 9 (SIGKILL)"
    assert exit_status(3) == 3
    assert exit_status(-signal.SIGTERM) == 143


def test_jobfailed_carries_exit_status() -> None:
    assert JobFailed("x", returncode=exit_status(-9)).exit_code == 137
    assert JobFailed("x", returncode=exit_status(3)).exit_code == 3


def test_free_port_is_bindable() -> None:
    port = free_port()
    assert 0 < port < 65536
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # raises if someone holds it


def test_run_ids_are_unique() -> None:
    ids = {new_run_id() for _ in range(50)}
    assert len(ids) == 50 and all(i.startswith("local-") for i in ids)


@pytest.mark.parametrize("bad", ["soon", "-1", "1e9"])
def test_bad_grace_option(bad: str) -> None:
    sched = LocalScheduler()
    spec = spec_for(["t.py"], options=(("grace", bad),))
    with pytest.raises(SpecError, match="grace"):
        sched.run(sched.render(spec))


def test_container_wraps_each_rank() -> None:
    from torchhpc.core.spec import ContainerSpec

    spec = spec_for(["examples/pi.py"], nproc_per_node=2, container=ContainerSpec(image="img.sif"))
    sub = LocalScheduler().render(spec)
    assert sub.argv[0] == "apptainer" and "img.sif" in sub.argv
    assert sub.argv[-2:] == ("python", "examples/pi.py")  # the container's python, not ours
    with pytest.raises(SpecError, match="pyxis"):
        LocalScheduler().render(spec.with_(container=ContainerSpec(image="nvcr.io#x", runtime="pyxis")))
