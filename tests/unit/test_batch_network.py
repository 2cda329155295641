"""--network in batch scripts, Slurm and PBS alike: presets with setdefault semantics, ``auto`` detection.

Rendered through the CLI's dry run (what a user sees), then the network block
is run by a real bash. Each of the first three tests failed before the shared
batch backend (issue 19): PBS rendered no detection at all, Slurm split the
name on "," only (``auto+debug`` detected nothing), and presets arrived as
plain ``export`` lines that overwrote a variable set at submit time.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from torchhpc.cli.main import main

SCHEDULERS = ("slurm", "pbs")


def dry_run(capsys: pytest.CaptureFixture[str], tmp_path: Path, scheduler: str, *extra: str) -> str:
    rc = main([
        "run", "--scheduler", scheduler, "--launcher", "mpirun", "--nodes", "2", "--nproc-per-node", "2",
        "--output-dir", str(tmp_path), *extra, "--dry-run", "examples/pi.py",
    ])
    out = capsys.readouterr().out
    assert rc == 0, out
    return out


def network_block(script: str) -> list[str]:
    """The lines the network step adds: after the rendezvous exports, before the start line."""
    lines = [line.strip() for line in script.splitlines()]  # the job's lines are indented inside main()
    start = next(i for i, line in enumerate(lines) if line.startswith("export MASTER_ADDR MASTER_PORT"))
    end = next(i for i, line in enumerate(lines) if line.startswith('echo "torchhpc: job'))
    return lines[start + 1 : end]


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_auto_detects_on_the_node(scheduler: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    block = network_block(dry_run(capsys, tmp_path, scheduler, "--network", "auto"))
    assert any("-m torchhpc net detect --export" in line for line in block), block


@pytest.mark.parametrize("scheduler", SCHEDULERS)
@pytest.mark.parametrize("network", ["auto+debug", "auto,debug", "debug+auto"])
def test_auto_combined_with_a_preset(
    scheduler: str, network: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    block = network_block(dry_run(capsys, tmp_path, scheduler, "--network", network))
    assert any("net detect --export" in line for line in block), block
    assert '[ -n "${NCCL_DEBUG+x}" ] || export NCCL_DEBUG=INFO' in block, block


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_presets_never_overwrite_a_variable_set_at_submit_time(
    scheduler: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    script = dry_run(capsys, tmp_path, scheduler, "--network", "debug")
    assert "\nexport NCCL_DEBUG=INFO\n" not in script  # a plain export overwrote the user's value
    block = network_block(script)
    probe = "\n".join(["set -euo pipefail", *block, 'echo "$NCCL_DEBUG $TORCH_DISTRIBUTED_DEBUG"'])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "TORCH_"))}
    mine = subprocess.run(["bash", "-c", probe], env={**env, "NCCL_DEBUG": "WARN"}, capture_output=True, text=True)
    assert mine.stdout.strip() == "WARN DETAIL", mine.stderr
    empty = subprocess.run(["bash", "-c", probe], env={**env, "NCCL_DEBUG": ""}, capture_output=True, text=True)
    assert empty.stdout.strip() == "DETAIL", empty.stderr  # set to "" is the user's choice too
    unset = subprocess.run(["bash", "-c", probe], env=env, capture_output=True, text=True)
    assert unset.stdout.strip() == "INFO DETAIL", unset.stderr


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_env_flag_wins_over_a_preset(scheduler: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    script = dry_run(capsys, tmp_path, scheduler, "--network", "debug", "--env", "NCCL_DEBUG=WARN")
    assert script.index("export NCCL_DEBUG=WARN") < script.index('[ -n "${NCCL_DEBUG+x}" ]')


def test_slurm_and_pbs_render_the_network_alike(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    blocks = [network_block(dry_run(capsys, tmp_path, s, "--network", "roce,auto")) for s in SCHEDULERS]
    assert blocks[0] == blocks[1] and len(blocks[0]) > 3, blocks


def test_auto_block_runs_in_bash_and_keeps_user_values(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The real detector on this machine, as the batch shell runs it (master on loopback)."""
    block = network_block(dry_run(capsys, tmp_path, "slurm", "--network", "auto"))
    probe = "\n".join(["set -euo pipefail", "MASTER_ADDR=127.0.0.1", *block,
                       'echo "${NCCL_SOCKET_IFNAME:-unset} $GLOO_SOCKET_IFNAME"'])
    env = {k: v for k, v in os.environ.items() if not k.endswith("SOCKET_IFNAME")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    r = subprocess.run(["bash", "-c", probe], env={**env, "GLOO_SOCKET_IFNAME": "mine0"},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[-1] == "mine0", r.stdout


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_preset_variables_reach_ranks_that_get_only_named_variables(
    scheduler: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """mpirun forwards only what -x names (and pbsdsh only its env words): the presets' names are
    listed there, as the --env names are, since they are no longer part of the job's env."""
    script = dry_run(capsys, tmp_path, scheduler, "--network", "debug")
    assert "-x NCCL_DEBUG" in script and "-x TORCH_DISTRIBUTED_DEBUG" in script, script
