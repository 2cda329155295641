"""derive_port(): the MASTER_PORT every rank computes from the job id, and its shell twin."""

from __future__ import annotations

import subprocess

import pytest

from torchhpc.env import PORT_BASE, PORT_SPAN, derive_port
from torchhpc.schedulers.slurm.slurm import PORT_EXPR


@pytest.mark.parametrize(
    ("job_id", "port"),
    [
        ("13", 10013),
        ("4242", 14242),
        ("20000", 10000),
        ("123456", 13456),
        ("1234.pbs01", 11234),  # PBS appends the server: only the part before the dot counts
        ("123[4].pbs01", 11234),  # PBS array element: its index is part of the number
        (" 77 ", 10077),
    ],
)
def test_job_level_formula(job_id: str, port: int) -> None:
    assert derive_port(job_id) == port


def test_range_is_unprivileged_and_below_ephemeral() -> None:
    ports = {derive_port(str(j)) for j in range(0, 100_000, 7)}
    assert min(ports) >= 10000 and max(ports) <= 29999
    assert (PORT_BASE, PORT_SPAN) == (10000, 20000)
    assert len(ports) > 10000  # spread over the range, not clumped


def test_id_without_digits_is_stable() -> None:
    assert derive_port("abc") == derive_port("abc")
    assert 10000 <= derive_port("abc") <= 29999
    assert derive_port("abc") != derive_port("abd")


@pytest.mark.parametrize("job_id", ["1", "13", "19999", "20000", "987654", "4294967295"])
def test_matches_the_slurm_scripts_shell_expression(job_id: str) -> None:
    """The rendered sbatch scripts compute the port in bash; both must agree."""
    out = subprocess.run(
        ["bash", "-c", f"echo {PORT_EXPR}"], env={"SLURM_JOB_ID": job_id}, capture_output=True, text=True, check=True
    ).stdout
    assert int(out) == derive_port(job_id)


def test_step_variant_differs_from_job_level_and_between_steps() -> None:
    job = "4242"
    ports = [derive_port(job, str(step)) for step in range(8)]
    assert derive_port(job) not in ports
    assert len(set(ports)) == len(ports)
    assert all(10000 <= p <= 29999 for p in ports)
    assert derive_port(job, None) == derive_port(job) == derive_port(job, "")
