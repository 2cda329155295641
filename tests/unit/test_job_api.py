"""The Python API's container keywords mean what the CLI's flags mean (Job(container="x.sif") used to crash)."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchhpc.core.spec import ContainerSpec
from torchhpc.errors import UsageError
from torchhpc.job import Job
from torchhpc.resolve import build_spec

PROFILE = {"profile": "mn5", "account": "bsc98", "qos": "acc_debug", "time": "00:30:00"}


pytestmark = pytest.mark.usefixtures("clean_user_env")


def test_container_as_an_image_string_renders() -> None:
    job = Job(["examples/pi.py"], scheduler="slurm", container="x.sif")
    assert job.spec.container == ContainerSpec("x.sif", runtime="apptainer")  # the CLI's default runtime
    assert "apptainer exec" in (job.render().script or "")


def test_container_string_is_the_same_spec_as_the_cli() -> None:
    api = Job(["examples/pi.py"], scheduler="slurm", container="x.sif", runtime="podman",
              bind="/data:/data:ro", container_env=["WANDB_API_KEY"], cleanenv=True).spec
    cli = build_spec({"scheduler": "slurm", "container": "x.sif", "runtime": "podman", "bind": ["/data:/data:ro"],
                      "container_env": ["WANDB_API_KEY"], "cleanenv": True}, ["examples/pi.py"])
    assert api == cli
    assert api.container is not None and api.container.binds == ("/data:/data:ro",)
    assert Job(["examples/pi.py"], scheduler="slurm", container=Path("x.sif")).spec.container == ContainerSpec("x.sif")


def test_container_string_takes_the_profiles_runtime() -> None:
    job = Job(["examples/pi.py"], container="mn5.sif", **PROFILE)
    assert job.spec.container is not None and job.spec.container.runtime == "singularity"
    assert job.spec.setup == build_spec({**PROFILE, "container": "mn5.sif"}, ["examples/pi.py"]).setup
    assert "singularity exec --nv" in (job.render().script or "")


def test_no_container_mirrors_the_cli_flag() -> None:
    with pytest.raises(UsageError) as e:
        Job(["examples/pi.py"], **PROFILE)  # mn5 runs every rank in singularity: an image is needed
    assert "--no-container" in (e.value.hint or "")
    job = Job(["examples/pi.py"], no_container=True, **PROFILE)
    assert job.spec.container is None and "singularity exec" not in (job.render().script or "")
    with pytest.raises(UsageError):
        Job(["examples/pi.py"], scheduler="slurm", container="x.sif", no_container=True)
    with pytest.raises(UsageError):
        Job(["examples/pi.py"], scheduler="slurm", container=ContainerSpec("x.sif"), no_container=True)


def test_container_spec_object_is_used_as_given() -> None:
    given = ContainerSpec("mn5.sif", runtime="podman", binds=("/a:/b",))
    assert Job(["examples/pi.py"], container=given, **PROFILE).spec.container == given


def test_bad_container_keywords() -> None:
    with pytest.raises(TypeError):
        Job(["examples/pi.py"], container=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Job(["examples/pi.py"], runtimes="podman")
    with pytest.raises(UsageError) as e:
        Job(["examples/pi.py"], scheduler="slurm", runtime="podman")
    assert "needs an image" in e.value.message


@pytest.mark.parametrize("given, words", [
    ({"after_any": "x y"}, "after_any='x y' is not a job id"),
    ({"after": "afterok:1"}, "after=afterok:1: that is Slurm's --dependency syntax, not a job id HINT: give the "
                             "job id itself: after=1"),
    ({"nodes": 0}, "nodes=0 must be at least 1"),
    ({"partition": "p\nx"}, "partition='p\\nx' contains a newline or carriage return HINT: partition must fit"),
    ({"hang_timeout": "soon"}, "hang_timeout='soon' is not valid"),
])
def test_job_errors_name_the_keyword_the_caller_wrote(given: dict[str, object], words: str) -> None:
    """Job() has no flags: its errors say after_any=, not --after-any (issue 46's sweep), and a value of
    the wrong type is one UsageError, not a ValueError from deep inside."""
    with pytest.raises(UsageError) as e:
        Job(["train.py"], scheduler="slurm", **given)
    assert words in str(e.value) and "--" + next(iter(given)).replace("_", "-") not in str(e.value)
