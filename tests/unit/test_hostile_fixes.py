"""The five injection paths of issue 20 (F1-F5), each through the public render API.

Each test failed on the code before the fix (see the issue-20 report for the runs).
What is real: bash runs the rendered text with stub commands on PATH; sbatch's own
parser reads Slurm scripts (``sbatch -v --test-only`` with a throw-away slurm.conf,
stopped once it has printed the options it parsed: no controller is needed).
What is fake: the Kubernetes API server (none can run here); F5 is checked before any
request is built.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.hostile import parse_records, sbatch_options, stub_dir
from torchhpc.core.spec import ContainerSpec, Entrypoint, JobSpec
from torchhpc.errors import UsageError
from torchhpc.launchers.boot import boot_files
from torchhpc.schedulers import get_scheduler


def _slurm(tmp_path: Path, args: tuple[str, ...] = (), env: tuple[tuple[str, str], ...] = (), launcher: str = "srun") -> str:
    spec = JobSpec(
        entrypoint=Entrypoint.parse(["train.py", *args], python="python"),
        nodes=1, nproc_per_node=1, scheduler="slurm", launcher=launcher, name="job",
        output_dir=str(tmp_path), env=env,
    )
    script = get_scheduler("slurm").render(spec).script
    assert script is not None
    return script


def _run(script: str, tmp_path: Path) -> list[list[bytes]]:
    path = tmp_path / "job.sh"
    path.write_text(script)
    boot = next(shlex.split(ln.split("=", 1)[1])[0] for ln in script.splitlines() if "export TORCHHPC_BOOT_DIR=" in ln)
    if ".torchhpc-boot-" in boot:  # the copy the submit writes (the job's python is not this one)
        Path(boot).mkdir(parents=True, exist_ok=True)
        for name, text in boot_files():
            Path(boot, name).write_text(text)
    log = tmp_path / "stub.log"
    env = {
        "PATH": f"{stub_dir()}:/usr/bin:/bin", "STUB_LOG": str(log), "HOME": str(tmp_path),
        "SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "node1", "SLURM_NNODES": "1", "SLURM_NTASKS": "1",
        # the torchhpc under test, also for `python -m torchhpc net detect` inside the script
        **({"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}),
    }
    r = subprocess.run(["bash", str(path)], cwd=tmp_path, env=env, capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    return parse_records(log.read_bytes())


@pytest.mark.parametrize("launcher", ["srun", "torchrun", "mpirun"])
def test_f1_trailing_newline_argument_does_not_start_a_command(launcher: str, tmp_path: Path) -> None:
    """F1: ``train.py $'x\\n' touch PWNED`` rendered ``... train.py x`` and a new line ``touch PWNED``."""
    script = _slurm(tmp_path, ("x\n", "touch", "PWNED"), launcher=launcher)
    records = _run(script, tmp_path)
    assert not (tmp_path / "PWNED").exists(), "the argument after x\\n ran as a command"
    last = records[-1]
    assert last[-3:] == [b"x\n", b"touch", b"PWNED"], last


def test_f2_pbs_lines_in_values_do_not_reach_sbatch(tmp_path: Path) -> None:
    """F2: sbatch honours ``#PBS`` at any line start of the body; a value with a newline put one there."""
    evil = "x\n#PBS -q evilpart\n#PBS -v LD_PRELOAD=/tmp/evil.so\n#PBS -o /tmp/pwned.out"
    script = _slurm(tmp_path, (evil,), env=(("HV", evil),))
    assert not any(line.startswith("#PBS") for line in script.splitlines())
    opts = sbatch_options(script, tmp_path)
    assert "partition" not in opts and "export" not in opts, opts
    assert opts["output"].startswith(str(tmp_path)), opts
    records = _run(script, tmp_path)
    assert records[-1][-1] == evil.encode()


def test_f2_single_quote_in_sbatch_value(tmp_path: Path) -> None:
    spec = JobSpec(entrypoint=Entrypoint.parse(["train.py"]), scheduler="slurm", name="O'Brien", output_dir=str(tmp_path))
    script = get_scheduler("slurm").render(spec).script
    assert script is not None
    assert sbatch_options(script, tmp_path)["job-name"] == "O'Brien"


RUNTIMES = ("apptainer", "singularity", "pyxis", "enroot", "docker", "podman", "charliecloud")


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("image", ["--privileged", "-v/:/host", "-"])
def test_f4_image_starting_with_dash_is_refused(runtime: str, image: str, tmp_path: Path) -> None:
    """F4: ``--container=--privileged`` became a runtime option (podman, apptainer, ch-run, enroot)."""
    with pytest.raises(UsageError, match="--container"):
        spec = JobSpec(
            entrypoint=Entrypoint.parse(["train.py"]), scheduler="slurm", output_dir=str(tmp_path),
            container=ContainerSpec(image, runtime),
        )
        get_scheduler("slurm").render(spec)


@pytest.mark.parametrize(
    "namespace",
    ["x/../../../api/v1/namespaces/kube-system/secrets?", "a b", "Default", "x\n", "-x", "a" * 64, ""],
)
def test_f5_kubernetes_namespace_is_a_dns_label(namespace: str, tmp_path: Path) -> None:
    """F5: the API path was built from ``--opt namespace`` unescaped."""
    with pytest.raises(UsageError, match="namespace"):
        spec = JobSpec(
            entrypoint=Entrypoint.parse(["train.py"]), scheduler="kubernetes", output_dir=str(tmp_path),
            options=(("image", "img:1"), ("namespace", namespace)),
        )
        get_scheduler("kubernetes").render(spec)


def test_f5_job_id_namespace_checked_before_any_request() -> None:
    from torchhpc.schedulers.kubernetes.kubernetes import KubernetesScheduler

    sched = KubernetesScheduler()
    for job_id in ("x/../../api/v1/secrets?/pi", "a b/pi", "default/../x"):
        with pytest.raises(UsageError):
            sched._locate(job_id)


def test_stub_dir_is_executable() -> None:
    assert os.access(stub_dir() / "srun", os.X_OK)


def test_f3_net_detect_export_never_runs_the_master(tmp_path: Path) -> None:
    """F3: ``net detect --export`` printed ``--master`` raw in a comment; under ``eval`` a newline in it ran."""
    import sys

    evil = "x\ntouch PWNED #"
    r = subprocess.run(
        [sys.executable, "-m", "torchhpc", "net", "detect", "--export", "--master", evil],
        capture_output=True, text=True, timeout=120,
    )
    subprocess.run(["bash", "-c", f"eval {_sq(r.stdout)}"], cwd=tmp_path, capture_output=True, timeout=60)
    assert not (tmp_path / "PWNED").exists(), r.stdout
    if r.returncode:
        assert r.returncode == 2 and r.stderr.startswith("Error: --master"), r.stderr


def test_f3_network_auto_job_with_hostile_master_addr(tmp_path: Path) -> None:
    """F3 through a rendered job: ``--network auto`` evals ``net detect`` with MASTER_ADDR from ``--env``."""
    spec = JobSpec(
        entrypoint=Entrypoint.parse(["train.py"], python="python"), scheduler="slurm", launcher="srun",
        name="job", output_dir=str(tmp_path), network="auto", env=(("MASTER_ADDR", "x\ntouch PWNED #"),),
    )
    script = get_scheduler("slurm").render(spec).script
    assert script is not None
    _run(script, tmp_path)
    assert not (tmp_path / "PWNED").exists()


def _sq(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


@pytest.mark.parametrize(("name", "out"), [("../../escape", "logs"), ("a%j/b", "logs"), ("pi", "lo%jgs")])
def test_log_path_stays_in_the_output_dir(name: str, out: str, tmp_path: Path) -> None:
    """'%' and '../' in names and directories: sbatch's --output must name a file in --output-dir."""
    from torchhpc.schedulers.slurm.slurm import expand_output

    out_dir = tmp_path / out
    spec = JobSpec(entrypoint=Entrypoint.parse(["train.py"]), scheduler="slurm", name=name, output_dir=str(out_dir))
    script = get_scheduler("slurm").render(spec).script
    assert script is not None
    pattern = sbatch_options(script, tmp_path)["output"]
    log = Path(expand_output(pattern, name, "42"))
    assert log.parent == out_dir and log.name.endswith("-42.out"), log


@pytest.mark.parametrize("launcher", ["torchrun", "srun"])
def test_program_leading_double_dash_reaches_the_program(launcher: str, tmp_path: Path) -> None:
    """torchrun's parser dropped a ``--`` right after the script: ``train.py -- x`` gave the program ``x``."""
    from tests.hostile import _torchrun_view

    script = _slurm(tmp_path, ("--", "x"), launcher=launcher)
    last = _torchrun_view(_run(script, tmp_path)[-1])
    assert last[-3:] == [b"train.py", b"--", b"x"] and b"python" in last, last


def test_kubernetes_yaml_keeps_non_bmp_characters(tmp_path: Path) -> None:
    """JSON's surrogate-pair escapes (\\ud83d\\ude00) are not YAML: emoji are written as themselves."""
    import yaml

    value = "a😀b\u2028c\x7f"
    spec = JobSpec(
        entrypoint=Entrypoint.parse(["train.py", value]), scheduler="kubernetes", output_dir=str(tmp_path),
        env=(("V", value),), options=(("image", "img:1"),),
    )
    text = get_scheduler("kubernetes").render(spec).script
    assert text is not None and "\\ud83d" not in text
    container = yaml.safe_load(text)["spec"]["trainer"]  # a TrainJob: command and env are trainer fields
    assert {"name": "V", "value": value} in container["env"]
    assert container["command"][-1] == value
