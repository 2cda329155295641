"""Container wrappers: golden renderings per runtime, documented-flag checks, errors, hostile paths.

Apptainer/Singularity, enroot, pyxis and a Docker engine cannot be installed on the
development machine, so their output is checked here against their *documented*
syntax: golden files (reviewed against apptainer.org's ``exec`` page, enroot's
doc/cmd/*.md, pyxis' README flag list, docs.docker.com's ``run`` reference) plus a
check that every flag rendered is one those documents list. Podman and Charliecloud
also run for real in tests/integration/test_containers_slurm.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import HOSTILE
from tests.golden_util import assert_golden, lint_script
from torchhpc.containers import MODULES, runtime_options, sbatch_directives, setup_lines, srun_options, wrap
from torchhpc.containers._common import BOOT_DIR, enroot_ref
from torchhpc.containers.apptainer import image_uri
from torchhpc.core.shell import join
from torchhpc.core.spec import RUNTIMES, ContainerSpec
from torchhpc.errors import ConfigError, QuotingError, SpecError, TorchHPCError

SHIM = ["bash", "-c", 'exec "$@"', "torchhpc-task"]
TRAIN = [*SHIM, "python", "train.py", "--lr", "0.1"]
PASS = ["MASTER_ADDR", "MASTER_PORT", "SLURM_*", "PMIX_*", "OMPI_*"]
NGC = "nvcr.io/nvidia/pytorch:24.03-py3"

# Flags each runtime documents (the commands' reference pages named in the module docstring).
DOCUMENTED = {
    "apptainer": {"--nv", "--rocm", "--cleanenv", "--containall", "--no-home", "--writable-tmpfs", "--bind", "--pwd"},
    "pyxis": {
        "--container-image", "--container-mounts", "--container-workdir", "--container-name",
        "--container-save", "--container-mount-home", "--no-container-mount-home",
        "--container-remap-root", "--no-container-remap-root", "--container-entrypoint",
        "--no-container-entrypoint", "--container-writable", "--container-readonly", "--container-env",
    },
    "enroot": {"--conf", "--env", "--rc", "--root", "--rw", "--mount", "--output", "--name"},
    "docker": {"--rm", "--gpus", "--device", "--group-add", "--ipc", "--network", "--uts", "--ulimit",
               "--shm-size", "--pull", "--user", "-v", "-w", "-e"},
    "charliecloud": {"--bind", "--cd", "--write", "--private-tmp", "--home", "--set-env", "--env-no-expand"},
}
DOCUMENTED["singularity"] = DOCUMENTED["apptainer"]
DOCUMENTED["podman"] = DOCUMENTED["docker"] | {"--root", "--runroot", "--cgroup-manager", "--events-backend"}  # podman(1) globals

# name -> (spec, argv, gpus, gpu_kind, pass_env)
CASES: dict[str, tuple[ContainerSpec, list[str], int, str, list[str]]] = {
    # seed 000: singularity exec --nv --bind /home/upc/... MN5-NGC-PyTorch-24.03.sif
    "singularity_seed000": (
        ContainerSpec("MN5-NGC-PyTorch-24.03.sif", "singularity", binds=("/home/upc/upc580327/MN5-Distributed-PyTorch",)),
        TRAIN, 4, "nvidia", PASS,
    ),
    "apptainer_nv_binds": (
        ContainerSpec("/scratch/images/pytorch.sif", "apptainer",
                      binds=("/scratch/data:/data:ro", "/scratch/out:/out"), workdir="/workspace"),
        TRAIN, 4, "nvidia", PASS,
    ),
    # LUMI-style: ROCm, a clean environment, the rank variables re-exported under APPTAINERENV_
    "apptainer_rocm_cleanenv": (
        ContainerSpec("docker://rocm/pytorch:latest", "apptainer", env=("NCCL_DEBUG=INFO", "MIOPEN_USER_DB_PATH"),
                      cleanenv=True, options=(("writable_tmpfs", "true"),)),
        TRAIN, 8, "amd", PASS,
    ),
    "pyxis_ngc": (
        ContainerSpec(NGC, "pyxis", binds=("/scratch/data:/data:ro",), env=("NCCL_DEBUG",),
                      options=(("name", "pt2403"), ("mount_home", "false"))),
        TRAIN, 4, "nvidia", PASS,
    ),
    "enroot_ngc": (
        ContainerSpec(NGC, "enroot", binds=("/scratch/data:/data:ro",), env=("NCCL_DEBUG=INFO",),
                      options=(("rw", "true"),)),
        TRAIN, 4, "nvidia", PASS,
    ),
    "enroot_sqsh_direct": (
        ContainerSpec("/scratch/images/pytorch.sqsh", "enroot", options=(("create", "false"),)),
        TRAIN, 0, "nvidia", ["MASTER_ADDR", "RANK"],
    ),
    # seed 000: docker run --ipc=host --ulimit memlock=-1 --ulimit stack=67108864 --rm mn5
    "docker_seed000": (ContainerSpec("mn5", "docker"), TRAIN, 4, "nvidia", PASS),
    "docker_amd_shm": (
        ContainerSpec("rocm/pytorch:latest", "docker", binds=("/scratch/data:/data:ro",),
                      options=(("ipc", "private"), ("shm_size", "16g"))),
        TRAIN, 8, "amd", ["MASTER_ADDR", "MASTER_PORT"],
    ),
    "podman_cdi": (
        ContainerSpec(NGC, "podman", binds=("/scratch/data:/data:ro",), env=("NCCL_DEBUG=INFO",),
                      options=(("podman_root", "/var/tmp/podman/root"), ("podman_runroot", "/var/tmp/podman/run"),
                               ("podman_args", "--cgroup-manager=cgroupfs --events-backend=file"),
                               ("pull", "never"))),
        TRAIN, 4, "nvidia", PASS,
    ),
    "charliecloud_dir": (
        ContainerSpec("/var/tmp/images/pytorch", "charliecloud", binds=("/scratch/data:/data",),
                      env=("NCCL_DEBUG=INFO",)),
        TRAIN, 0, "nvidia", PASS,
    ),
}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Golden output must not depend on the machine: fixed cwd, no binary overrides."""
    for rt in RUNTIMES:
        monkeypatch.delenv(f"TORCHHPC_{rt.upper()}_BINARY", raising=False)
    cwd = tmp_path / "project"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return cwd


def render_case(name: str) -> str:
    spec, argv, gpus, kind, pass_env = CASES[name]
    lines = [
        "#!/bin/bash",
        f"# golden: torchhpc.containers.wrap() for --runtime {spec.runtime} (case {name});",
        "# checked against the runtime's documented syntax (it cannot be installed on the dev machine"
        + (")" if spec.runtime not in ("podman", "charliecloud") else "; it also runs for real in tests/integration)"),
        *sbatch_directives(spec),
        *setup_lines(spec),
    ]
    srun = srun_options(spec)
    cmd = wrap(spec, argv, gpus=gpus, gpu_kind=kind, pass_env=pass_env, boot_var="TORCHHPC_BOOT_DIR")  # a script's form
    lines.append(join(["srun", *srun, *cmd]) if srun else join(cmd))
    text = "\n".join(lines) + "\n"
    return text.replace(os.getcwd(), "/home/user/project")


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_and_lint(name: str, tmp_path: Path) -> None:
    text = render_case(name)
    assert_golden(text, f"containers/{name}.sh")
    lint_script(text, tmp_path)


@pytest.mark.parametrize("name", sorted(CASES))
def test_only_documented_flags(name: str) -> None:
    spec, argv, gpus, kind, pass_env = CASES[name]
    rendered = [*srun_options(spec), *wrap(spec, argv, gpus=gpus, gpu_kind=kind, pass_env=pass_env)]
    # flags of the runtime itself: before the image (after it, argv belongs to the task)
    image_at = max(i for i, a in enumerate(rendered) if a.endswith(("sif", "sqsh", "pytorch")) or a in (
        spec.image, image_uri(spec.image), "pt2403", "pytorch+24.03-py3", "--container-image=" + enroot_ref(spec.image)))
    flags = {a.split("=", 1)[0] for a in rendered[: image_at + 1] if a.startswith("-") and a != "--"}
    flags -= {"-c"}  # bash -c of the env-expanding prelude
    assert flags <= DOCUMENTED[spec.runtime], flags - DOCUMENTED[spec.runtime]


def test_seed000_singularity_command() -> None:
    spec = ContainerSpec("MN5-NGC-PyTorch-24.03.sif", "singularity",
                         binds=("/home/upc/upc580327/MN5-Distributed-PyTorch",))
    assert wrap(spec, ["nvidia-smi"], gpus=4) == [
        "singularity", "exec", "--nv", "--bind", "/home/upc/upc580327/MN5-Distributed-PyTorch",
        "MN5-NGC-PyTorch-24.03.sif", "nvidia-smi",
    ]


def test_seed000_docker_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    argv = wrap(ContainerSpec("mn5", "docker", options=(("mount_cwd", "false"),)), ["bash"], gpus=1)
    text = join(argv)
    # The GPUs are added when the task starts (test_containers_allocation.py): never --gpus all.
    assert argv[:3] == ["bash", f"{BOOT_DIR}/gpus.sh", "docker"]
    assert " docker run --rm --ipc=host --network=host --uts=host " in text and "all" not in argv
    assert "--ulimit memlock=-1 --ulimit stack=67108864" in text
    assert argv[-2:] == ["mn5", "bash"]
    assert "-v" not in argv and "-w" not in argv


def test_podman_uses_cdi_and_wildcards() -> None:
    argv = wrap(ContainerSpec("img", "podman"), ["true"], gpus=2, pass_env=["SLURM_*", "RANK"])
    assert argv[:3] == ["bash", f"{BOOT_DIR}/gpus.sh", "podman"]  # the GPUs, at task start
    assert argv[4] == "podman"  # podman understands PREFIX* itself: no env prelude
    assert "SLURM_*" in argv and "--gpus" not in argv and "nvidia.com/gpu=all" not in argv
    assert wrap(ContainerSpec("img", "podman"), ["true"], gpus=0, pass_env=["RANK"])[0] == "podman"


def test_apptainer_gpu_flags() -> None:
    spec = ContainerSpec("x.sif", "apptainer")
    assert "--nv" in wrap(spec, ["true"], gpus=1, gpu_kind="nvidia")
    assert "--rocm" in wrap(spec, ["true"], gpus=1, gpu_kind="amd")
    assert not {"--nv", "--rocm"} & set(wrap(spec, ["true"], gpus=0))
    with pytest.raises(SpecError, match="intel"):
        wrap(spec, ["true"], gpus=1, gpu_kind="intel")


@pytest.mark.parametrize(
    ("image", "uri"),
    [("x.sif", "x.sif"), ("docker://ubuntu:22.04", "docker://ubuntu:22.04"), (NGC, "docker://" + NGC),
     ("ubuntu:22.04", "docker://ubuntu:22.04"), ("oras://r.example/x:1", "oras://r.example/x:1")],
)
def test_apptainer_image_uri(image: str, uri: str) -> None:
    assert image_uri(image) == uri


@pytest.mark.parametrize(
    ("image", "ref"),
    [(NGC, "nvcr.io#nvidia/pytorch:24.03-py3"), ("docker://" + NGC, "nvcr.io#nvidia/pytorch:24.03-py3"),
     ("ubuntu:22.04", "ubuntu:22.04"), ("nvidia/cuda:12.4.1-base", "nvidia/cuda:12.4.1-base"),
     ("localhost/img:1", "localhost#img:1"), ("registry:5000/a/b:1", "registry:5000#a/b:1"),
     ("nvcr.io#nvidia/pytorch:24.03-py3", "nvcr.io#nvidia/pytorch:24.03-py3"),
     ("user@nvcr.io/nvidia/pytorch:1", "user@nvcr.io#nvidia/pytorch:1"), ("/images/x.sqsh", "/images/x.sqsh")],
)
def test_enroot_ref(image: str, ref: str) -> None:
    assert enroot_ref(image) == ref


def test_pyxis_sbatch_escapes_hash() -> None:
    lines = sbatch_directives(ContainerSpec(NGC, "pyxis", options=(("mount_cwd", "false"),)))
    assert lines == ["#SBATCH --container-image=nvcr.io\\#nvidia/pytorch:24.03-py3"]
    assert sbatch_directives(ContainerSpec("x.sif", "apptainer")) == []


def test_pyxis_wrap_is_identity_and_srun_options_carry_the_container() -> None:
    spec = ContainerSpec(NGC, "pyxis", env=("NCCL_DEBUG", "HF_HOME"))
    assert wrap(spec, TRAIN) == TRAIN
    opts = srun_options(spec)
    assert "--container-env=NCCL_DEBUG,HF_HOME" in opts
    assert f"--container-workdir={os.getcwd()}" in opts


@pytest.mark.parametrize("bad", ["/data,old:/data", "/data:/mnt,x", "/a:b:/c"])
def test_pyxis_rejects_what_its_lists_cannot_express(bad: str) -> None:
    with pytest.raises((QuotingError, SpecError)) as e:
        srun_options(ContainerSpec(NGC, "pyxis", binds=(bad,)) if bad.count(":") <= 2 else None)  # type: ignore[arg-type]
    assert "," in str(e.value) or ":" in str(e.value)


def test_pyxis_quoting_error_names_the_path() -> None:
    with pytest.raises(QuotingError) as e:
        srun_options(ContainerSpec(NGC, "pyxis", binds=("/scratch/run,1:/data",)))
    assert "/scratch/run,1" in e.value.message and e.value.hint


def test_pyxis_env_values_and_patterns_are_refused() -> None:
    with pytest.raises(SpecError, match="by name"):
        srun_options(ContainerSpec(NGC, "pyxis", env=("A=1",)))
    with pytest.raises(SpecError, match="patterns"):
        srun_options(ContainerSpec(NGC, "pyxis", env=("SLURM_*",)))


def test_unknown_option_lists_valid_ones() -> None:
    with pytest.raises(ConfigError) as e:
        wrap(ContainerSpec("img", "podman", options=(("podman_rot", "/x"),)), ["true"])
    assert "podman_rot" in e.value.message and "podman_root" in (e.value.hint or "")
    with pytest.raises(SpecError, match="podman"):
        wrap(ContainerSpec("img", "docker", options=(("podman_root", "/x"),)), ["true"])


def test_bool_option_must_be_boolean() -> None:
    with pytest.raises(ConfigError, match="boolean"):
        wrap(ContainerSpec("x.sif", "apptainer", options=(("containall", "maybe"),)), ["true"])


def test_charliecloud_refuses_readonly_and_cleanenv() -> None:
    with pytest.raises(SpecError, match="read-only"):
        wrap(ContainerSpec("/img", "charliecloud", binds=("/a:/b:ro",)), ["true"])
    with pytest.raises(SpecError, match="cleanenv"):
        wrap(ContainerSpec("/img", "charliecloud", cleanenv=True), ["true"])


def test_charliecloud_mounts_a_bind_after_the_one_that_holds_its_target() -> None:
    """ch-run binds only onto directories that exist, in order: the job dir inside the bound checkout
    failed every rank with "can't mkdir ... Read-only file system" when it came first."""
    argv = wrap(ContainerSpec("/img", "charliecloud", binds=("/w/c/out/job:/w/c/out/job", "/w/c:/w/c", "/d:/data")),
                ["true"])
    binds = [a for a in argv if a.startswith("--bind=")]
    assert binds.index("--bind=/w/c:/w/c") < binds.index("--bind=/w/c/out/job:/w/c/out/job"), binds
    assert "--bind=/d:/data" in binds


def test_docker_relative_bind_source_becomes_absolute(_clean_env: Path) -> None:
    argv = wrap(ContainerSpec("img", "docker", binds=("data:/data",), options=(("mount_cwd", "false"),)), ["true"])
    assert argv[argv.index("-v") + 1] == f"{_clean_env}/data:/data"
    with pytest.raises(SpecError, match="relative"):
        wrap(ContainerSpec("img", "docker", binds=("data:data",)), ["true"])


def test_apptainer_and_enroot_reject_separators() -> None:
    with pytest.raises(QuotingError, match="apptainer"):
        wrap(ContainerSpec("x.sif", "apptainer", binds=("/a,b:/c",)), ["true"])
    with pytest.raises(QuotingError, match="enroot"):
        wrap(ContainerSpec("img", "enroot", binds=("/a b:/c",)), ["true"])


def test_bad_pass_env_pattern() -> None:
    with pytest.raises(SpecError, match="SLURM-"):
        wrap(ContainerSpec("img", "podman"), ["true"], pass_env=["SLURM-*"])


def test_cwd_bind_not_duplicated_when_covered(_clean_env: Path) -> None:
    argv = wrap(ContainerSpec("img", "podman", binds=(f"{_clean_env.parent}",)), ["true"])
    assert [a for a in argv if a.startswith(str(_clean_env.parent))] == [
        f"{_clean_env.parent}:{_clean_env.parent}", str(_clean_env)]


def test_binary_override_from_option_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = ContainerSpec("x.sif", "singularity")
    monkeypatch.setenv("TORCHHPC_SINGULARITY_BINARY", "bsc_singularity")
    assert wrap(spec, ["true"])[0] == "bsc_singularity"
    spec2 = ContainerSpec("x.sif", "singularity", options=(("binary", "/opt/s/bin/singularity"),))
    assert wrap(spec2, ["true"])[0] == "/opt/s/bin/singularity"


def test_every_runtime_has_options_and_module() -> None:
    for rt in RUNTIMES:
        assert rt in MODULES
        assert "binary" in runtime_options(rt)


def test_import_loads_no_torch() -> None:
    code = "import sys, torchhpc.containers, torchhpc.cli.container; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


# --- through a real shell ------------------------------------------------------------

ECHO = "#!/bin/sh\n# prints its argv NUL-separated, then the APPTAINERENV_/SINGULARITYENV_ variables\n" \
       "printf '%s\\0' \"$@\"; printf '\\n--env--\\n'; env | grep -E '^(APPTAINER|SINGULARITY)ENV_' | sort\n"


@pytest.fixture
def echo_binary(tmp_path: Path) -> str:
    path = tmp_path / "argv-echo"
    path.write_text(ECHO)
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize("runtime", ["apptainer", "docker", "podman", "charliecloud", "enroot"])
@pytest.mark.parametrize("value", HOSTILE, ids=lambda v: repr(v)[:20])
def test_hostile_values_through_bash(runtime: str, value: str, echo_binary: str, tmp_path: Path) -> None:
    """A hostile bind path, env value and argument reach the runtime unchanged, nothing runs."""
    src = f"{tmp_path}/d/{value}"
    env = ("V=" + value,)
    try:
        spec = ContainerSpec("/img", runtime, binds=(f"{src}:/data",), env=env, options=(("binary", echo_binary),))
        argv = wrap(spec, ["python", "-c", value])
    except TorchHPCError as e:
        # what the runtime's syntax cannot carry is refused, naming the value
        assert "\n" in value or " " in value, e
        return
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/bash\n" + join(argv) + "\n")
    r = subprocess.run(["bash", str(script)], capture_output=True, cwd=tmp_path, timeout=30)
    assert r.returncode == 0, r.stderr
    args, env_out = r.stdout.split(b"\n--env--\n")
    got = [g.decode() for g in args.split(b"\0")[:-1]]
    assert got == argv[argv.index(echo_binary) + 1 :]
    if runtime == "apptainer":  # values travel as APPTAINERENV_ variables of the runtime process
        assert env_out.decode() == f"APPTAINERENV_V={value}\n"
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "pwned2").exists()
    assert b"\nfoo\n" not in r.stdout


@pytest.mark.parametrize("value", HOSTILE, ids=lambda v: repr(v)[:20])
def test_hostile_values_pyxis_srun_line(value: str, echo_binary: str, tmp_path: Path) -> None:
    try:
        spec = ContainerSpec("/img.sqsh", "pyxis", binds=(f"{tmp_path}/{value}:/data",))
        opts = srun_options(spec)
    except TorchHPCError:
        assert "\n" in value
        return
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/bash\n" + join([echo_binary, *opts, "python", "-c", value]) + "\n")
    r = subprocess.run(["bash", str(script)], capture_output=True, cwd=tmp_path, timeout=30)
    got = [g.decode() for g in r.stdout.split(b"\n--env--\n")[0].split(b"\0")[:-1]]
    assert got == [*opts, "python", "-c", value]
    assert not (tmp_path / "pwned").exists()


def test_env_patterns_expand_at_run_time(echo_binary: str, tmp_path: Path) -> None:
    """docker/enroot get one flag per live SLURM_* variable; apptainer --cleanenv gets APPTAINERENV_*."""
    env = {"PATH": os.environ["PATH"], "SLURM_PROCID": "3", "SLURM_NODELIST": "n[1,2] x", "OTHER": "no"}
    docker = wrap(ContainerSpec("img", "docker", options=(("binary", echo_binary), ("mount_cwd", "false"))),
                  ["cmd"], pass_env=["SLURM_*", "RANK"])
    out = subprocess.run(["bash", "-c", join(docker)], env=env, capture_output=True, check=True).stdout
    args = [a.decode() for a in out.split(b"\n--env--\n")[0].split(b"\0")[:-1]]
    assert args[-2:] == ["img", "cmd"]
    pairs = {args[i + 1] for i, a in enumerate(args) if a == "-e"}
    assert pairs == {"RANK", "SLURM_PROCID", "SLURM_NODELIST"}

    app = wrap(ContainerSpec("x.sif", "apptainer", cleanenv=True, options=(("binary", echo_binary),)),
               ["cmd"], pass_env=["SLURM_*"])
    out = subprocess.run(["bash", "-c", join(app)], env=env, capture_output=True, check=True).stdout
    exported = out.split(b"\n--env--\n")[1].decode().splitlines()
    assert exported == ["APPTAINERENV_SLURM_NODELIST=n[1,2] x", "APPTAINERENV_SLURM_PROCID=3"]


def test_interactive_shell_gets_a_terminal_on_docker_and_podman() -> None:
    for rt in ("docker", "podman"):
        argv = wrap(ContainerSpec("img", rt), ["bash", "-i"], interactive=True)
        assert argv[argv.index("run") + 1 : argv.index("run") + 3] == ["--rm", "-it"]
        assert "-it" not in wrap(ContainerSpec("img", rt), ["bash", "-i"])
    assert wrap(ContainerSpec("x.sif", "apptainer"), ["bash", "-i"], interactive=True)[:2] == ["apptainer", "exec"]


@pytest.mark.parametrize("runtime", ["docker", "podman"])
def test_docker_and_podman_get_a_reference_they_accept(runtime: str) -> None:
    """docker run refuses docker://reg/img:1 ("invalid reference format"): the scheme is Apptainer's and
    enroot's (issue 51, item 9). Other schemes name what neither runtime pulls: refused, with the fix."""
    from torchhpc.containers.docker import docker_ref

    argv = wrap(ContainerSpec("docker://reg.example/img:1", runtime), ["true"])
    assert argv[-2:] == ["reg.example/img:1", "true"] and not any(a.startswith("docker://") for a in argv)
    assert docker_ref("reg/img:1", runtime) == "reg/img:1"
    with pytest.raises(SpecError, match="oras://"):
        wrap(ContainerSpec("oras://reg/img:1", runtime), ["true"])


def test_docker_reference_through_the_cli_dry_run(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "torchhpc", "run", "--scheduler", "slurm", "--dry-run", "--runtime", "docker",
                        "--container", "docker://reg/img:1", "-N", "1", "train.py"], capture_output=True, text=True,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert " reg/img:1 " in r.stdout and "docker://reg/img:1" not in r.stdout, r.stdout
