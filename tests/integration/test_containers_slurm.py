"""Containers for real: podman and Charliecloud under the dev cluster's Slurm, and locally.

The image is Debian bookworm + python3 + torch 2.13.0 (CPU), built from debootstrap
and imported into podman by .ci/build-test-image.sh (no registry is reachable here),
cached under /var/tmp; the same root filesystem is the Charliecloud image directory.
Podman needs this sandbox's work-arounds, which live in the wrapper that script
generates and reach torchhpc through TORCHHPC_PODMAN_BINARY, the knob a site uses for
its own wrapper. Nothing is faked: sbatch, srun, torchrun, podman/crun and ch-run run,
and the ranks' gloo all_reduce crosses two namespace nodes.

Proof that ranks really run inside: each rank reads the marker file the build puts in the image
(/etc/torchhpc-test-image), which the host does not have; the image's python is /usr/bin/python.
A Python version cannot prove it: Debian's 3.11.2 is also the host's on a runner built on it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import HOSTILE, REPO, container_image_env
from torchhpc.containers import wrap
from torchhpc.core.shell import join
from torchhpc.core.spec import ContainerSpec

PROBE = (
    "import os, socket, sys; "
    "m = '/etc/torchhpc-test-image'; mark = open(m).read().split()[-1] if os.path.exists(m) else 'none'; "
    "print('probe rank', os.environ.get('RANK'), 'of', os.environ.get('WORLD_SIZE'), 'on', socket.gethostname(), "
    "'python', os.path.realpath(sys.executable), 'marker', mark, 'cwd', os.getcwd(), flush=True)"
)


@pytest.fixture(scope="module")
def images() -> dict[str, str]:
    """Build (or reuse) the test images; their names/paths and the podman wrapper, as env vars."""
    return container_image_env()


def image_for(images: dict[str, str], runtime: str) -> str:
    return images["TORCHHPC_TEST_PODMAN_IMAGE" if runtime == "podman" else "TORCHHPC_TEST_CH_IMAGE"]


def run_torchhpc(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "torchhpc", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def cluster_env(cluster: Any, images: dict[str, str]) -> dict[str, str]:
    env = cluster.client_env()
    env.update(images)
    env.setdefault("USER", "root")  # ch-run refuses to start without $USER
    return env


@pytest.mark.cluster("slurm")
@pytest.mark.parametrize("launcher", ["srun", "torchrun", "mpirun"])
@pytest.mark.parametrize("runtime", ["podman", "charliecloud"])
def test_pi_two_nodes_in_containers(
    slurm_cluster: Any, images: dict[str, str], runtime: str, launcher: str, tmp_path: Path
) -> None:
    """The acceptance command: 2 nodes x 2 ranks, each task in its own container."""
    r = run_torchhpc(
        cluster_env(slurm_cluster, images),
        "run",
        "--scheduler",
        "slurm",
        "--nodes",
        "2",
        "--nproc-per-node",
        "2",
        "--launcher",
        launcher,
        "--runtime",
        runtime,
        "--container",
        image_for(images, runtime),
        "--output-dir",
        str(tmp_path),
        "--name",
        f"pi-{runtime}-{launcher}",
        "examples/pi.py",
        "--steps",
        "200000",
        "--wait",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert set(re.findall(r"rank (\d)/4", r.stdout)) == {"0", "1", "2", "3"}, r.stdout
    assert len(set(re.findall(r"rank \d/4 on (node\d)", r.stdout))) == 2, r.stdout  # any 2 of the 3 nodes
    err = float(re.search(r"error ([0-9.eE+-]+)", r.stdout).group(1))  # type: ignore[union-attr]
    assert err < 1e-9


@pytest.mark.cluster("slurm")
@pytest.mark.parametrize("runtime", ["podman", "charliecloud"])
def test_ranks_really_run_inside_the_image(
    slurm_cluster: Any, images: dict[str, str], runtime: str, tmp_path: Path
) -> None:
    r = run_torchhpc(
        cluster_env(slurm_cluster, images),
        "run",
        "--scheduler",
        "slurm",
        "--nodes",
        "2",
        "--nproc-per-node",
        "2",
        "--launcher",
        "srun",
        "--runtime",
        runtime,
        "--container",
        image_for(images, runtime),
        "--output-dir",
        str(tmp_path),
        "--name",
        f"probe-{runtime}",
        "--wait",
        "--",
        "python",
        "-c",
        PROBE,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    probes = re.findall(r"probe rank (\d) of 4 on (node\d) python (\S+) marker (\S+) cwd (\S+)", r.stdout)
    assert {p[0] for p in probes} == {"0", "1", "2", "3"}, r.stdout
    assert len({p[1] for p in probes}) == 2, r.stdout
    marker = Path(images["TORCHHPC_TEST_CH_IMAGE"] + images.get("TORCHHPC_TEST_IMAGE_MARKER", "/etc/torchhpc-test-image"))
    assert marker.is_file(), f"{marker}: the image has no marker (rebuild it: .ci/build-test-image.sh)"
    assert not Path("/etc/torchhpc-test-image").exists(), "the host has the image's marker: it proves nothing here"
    for _, _, exe, mark, cwd in probes:
        # inside the image: its interpreter, also where `python` on the host's PATH is a venv of the same path's
        # Python (the checkout is bound, so a venv over /usr/bin/python3 resolves to the image's)
        assert exe.startswith("/usr/bin/python3") and mark == marker.read_text().split()[-1], probes
        assert cwd == str(REPO)  # the working directory is bound at the same path


def test_local_scheduler_podman_two_ranks(images: dict[str, str], tmp_path: Path) -> None:
    """No cluster needed: the local scheduler wraps each rank in its own podman container."""
    env = {**os.environ, **images}
    r = run_torchhpc(
        env,
        "run",
        "-n",
        "2",
        "--runtime",
        "podman",
        "--container",
        images["TORCHHPC_TEST_PODMAN_IMAGE"],
        "examples/pi.py",
        "--steps",
        "100000",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert set(re.findall(r"rank (\d)/2", r.stdout)) == {"0", "1"}, r.stdout


@pytest.mark.parametrize("runtime", ["podman", "charliecloud"])
@pytest.mark.parametrize("value", [v for v in HOSTILE if v and "\n" not in v][:8], ids=lambda v: repr(v)[:16])
def test_hostile_bind_path_in_a_real_container(
    images: dict[str, str], runtime: str, value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bind source with a hostile name reaches the runtime intact through bash: a file
    written there is read back inside the container, and nothing is executed."""
    for k, v in images.items():
        monkeypatch.setenv(k, v)  # TORCHHPC_PODMAN_BINARY: the sandbox's podman wrapper
    monkeypatch.setenv("USER", os.environ.get("USER", "root"))
    src = tmp_path / "data" / value
    src.mkdir(parents=True)
    (src / "token.txt").write_text("token-ok\n")
    spec = ContainerSpec(
        image_for(images, runtime), runtime, binds=(f"{src}:/mnt",), options=(("mount_cwd", "false"),)
    )
    argv = wrap(spec, ["cat", "/mnt/token.txt"])
    env = {**os.environ, **images}
    env.setdefault("USER", "root")
    r = subprocess.run(
        ["bash", "-c", join(argv)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout == "token-ok\n"
    assert not list(tmp_path.glob("pwned*"))
