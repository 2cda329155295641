"""A bad geometry flag is named as itself (not as the value derived from it), with a HINT, exit 2."""

from __future__ import annotations

import pytest

from torchhpc.cli.main import main
from torchhpc.core.spec import Entrypoint, JobSpec
from torchhpc.errors import SpecError, UsageError
from torchhpc.resolve import build_spec

pytestmark = pytest.mark.usefixtures("clean_user_env")


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    rc = main(argv)
    return rc, capsys.readouterr().err.splitlines()


@pytest.mark.parametrize("gpus", ["-1", "-4"])
@pytest.mark.parametrize("sched", ["local", "slurm"])
def test_negative_gpus_per_node_is_named(gpus: str, sched: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = _cli(["run", "-s", sched, "--gpus-per-node", gpus, "--dry-run", "examples/pi.py"], capsys)
    assert rc == 2
    assert err[0] == f"Error: --gpus-per-node={gpus} must not be negative", err
    assert len(err) == 2 and err[1].startswith("HINT: ")


def test_spec_checks_gpus_before_the_derived_nproc() -> None:
    with pytest.raises(SpecError) as e:
        JobSpec(Entrypoint.parse(["pi.py"]), nproc_per_node=-1, gpus_per_node=-1)
    assert "--gpus-per-node" in e.value.message and e.value.hint


@pytest.mark.parametrize("ntasks", ["0", "-2"])
@pytest.mark.parametrize("nodes", ["1", "2"])
def test_ntasks_below_one_is_named(ntasks: str, nodes: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = _cli(["run", "-s", "slurm", "-N", nodes, "--ntasks", ntasks, "--dry-run", "examples/pi.py"], capsys)
    assert rc == 2
    assert err[0] == f"Error: --ntasks {ntasks} must be at least 1", err
    assert len(err) == 2 and err[1].startswith("HINT: ") and "divided" not in err[0]


def test_ntasks_with_zero_nodes_is_an_error_not_a_traceback() -> None:
    with pytest.raises(UsageError) as e:
        build_spec({"scheduler": "slurm", "nodes": 0, "ntasks": 4}, ["pi.py"])
    assert e.value.message == "--nodes=0 must be at least 1"  # JobSpec's one check; nothing divided by 0


def test_ntasks_still_divided_over_nodes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(UsageError) as e:
        build_spec({"scheduler": "slurm", "nodes": 2, "ntasks": 3}, ["pi.py"])
    assert "cannot be divided evenly over --nodes 2" in e.value.message
    assert build_spec({"scheduler": "slurm", "nodes": 2, "ntasks": 4}, ["pi.py"]).nproc_per_node == 2
