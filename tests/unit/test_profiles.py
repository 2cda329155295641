"""Site profiles: the seeds' values, user TOML files, strict keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchhpc.errors import ConfigError, UsageError
from torchhpc.network.presets import preset_env
from torchhpc.profiles import BUILTIN, Profile, get_profile, list_profiles, user_profile_paths
from torchhpc.profiles.builtin import LUMI_CPU_MASKS
from torchhpc.profiles.model import FIELD_DOCS


def env_with(tmp_path: Path, text: str) -> dict[str, str]:
    path = tmp_path / "profiles.toml"
    path.write_text(text)
    return {"TORCHHPC_PROFILES": str(path), "HOME": str(tmp_path)}


def test_builtins_list() -> None:
    assert list_profiles({"HOME": "/nonexistent"}) == ["mn5", "lumi", "alliance-cc", "sockeye", "rcp"]


def test_mn5_from_seed_000() -> None:
    p = get_profile("mn5", {"HOME": "/nonexistent"})
    assert (p.scheduler, p.gpus_per_node, p.cpus_per_gpu) == ("slurm", 4, 20)
    assert p.modules == ("singularity",) and p.container_runtime == "singularity"
    assert {"account", "qos"} <= set(p.require)
    assert p.setup_lines()[0] == "module load singularity"
    assert p.setup[0] == "module load singularity"  # resolved profiles carry the module lines in setup
    assert p.setup_lines() == list(p.setup)  # and setup_lines() does not repeat them


def test_lumi_from_seed_002() -> None:
    p = get_profile("lumi", {"HOME": "/nonexistent"})
    assert p.partition == "standard-g" and p.gpus_per_node == 8 and p.mem == "480G"
    assert p.gpu_kind == "amd" and p.launcher == "srun"
    # The seed builds its masks from c=fe; ours must be the same string.
    c = "fe"
    seed = f"0x{c}000000000000,0x{c}00000000000000,0x{c}0000,0x{c}000000,0x{c},0x{c}00,0x{c}00000000,0x{c}0000000000"
    assert p.cpu_bind == "mask_cpu:" + seed
    masks = [int(m, 16) for m in seed.split(",")]
    assert all(bin(m).count("1") == 7 for m in masks) and len(set(masks)) == 8  # 7 cores per GCD, disjoint
    assert p.cpus_per_gpu == 7
    assert preset_env(p.network or "")["NCCL_SOCKET_IFNAME"] == "hsn0,hsn1,hsn2,hsn3"
    assert p.container_image == "$SIF"
    assert any("MIOPEN_USER_DB_PATH" in line for line in p.setup)
    assert p.setup[:2] == (
        "module load LUMI/24.03",
        "module load PyTorch/2.3.1-rocm-6.0.3-python-3.12-singularity-20240923",
    )
    assert any("MIOPEN_CUSTOM_CACHE_DIR" in line for line in p.setup)


def test_sockeye_rcp_alliance() -> None:
    home = {"HOME": "/nonexistent"}
    s = get_profile("sockeye", home)
    assert s.scheduler == "pbs" and s.launcher == "mpirun"
    assert dict(s.env) == {"OMPI_MCA_pml": "ob1", "OMPI_MCA_btl": "^openib"}  # seed 003's -mca flags
    r = get_profile("rcp", home)
    assert r.scheduler == "runai" and r.network == "roce,auto"  # GID index detected at pod start
    assert dict(r.options)["annotation"] == "k8s.v1.cni.cncf.io/networks=kube-system/roce"
    assert dict(r.options)["extended-resource"] == "rdma/rdma=1"
    a = get_profile("alliance-cc", home)
    assert a.scheduler == "slurm" and "account" in a.require


def test_every_builtin_field_is_documented_and_valid() -> None:
    for p in BUILTIN.values():
        assert set(p.to_dict()) <= set(FIELD_DOCS)
        if p.network:
            preset_env(p.network)
        # Round trip through the TOML-facing constructor: built-ins obey the user rules.
        data = {k: v for k, v in p.to_dict().items() if k != "name"}
        assert Profile.from_mapping(p.name, data, "test") == p


def test_user_profile_extends_and_overrides(tmp_path: Path) -> None:
    env = env_with(tmp_path, """
[lumi]
account = "project_465001726"
env = { MIOPEN_DEBUG = "0" }

[mylab]
extends = "mn5"
qos = "acc_bsccs"
time = "00:30:00"
env = { NCCL_DEBUG = "WARN" }

[child]
extends = "mylab"
account = "bsc98"
env = { NCCL_DEBUG = "INFO", X = 1 }
""")
    lumi = get_profile("lumi", env)
    assert lumi.account == "project_465001726" and lumi.partition == "standard-g"
    assert dict(lumi.env) == {"TORCHHPC_GPU_PER_TASK": "ROCR_VISIBLE_DEVICES", "TORCHHPC_CPU_MASKS": LUMI_CPU_MASKS,
                             "MIOPEN_DEBUG": "0"}  # the user's table adds to the built-in env
    child = get_profile("child", env)
    assert (child.qos, child.account, child.time, child.gpus_per_node) == ("acc_bsccs", "bsc98", "00:30:00", 4)
    assert dict(child.env) == {"NCCL_DEBUG": "INFO", "X": "1"}
    assert list_profiles(env)[-2:] == ["mylab", "child"]


def test_unknown_key_lists_valid_keys(tmp_path: Path) -> None:
    env = env_with(tmp_path, '[x]\npartiton = "gpu"\n')
    with pytest.raises(ConfigError) as e:
        get_profile("x", env)
    assert "'partiton'" in e.value.message and str(tmp_path) in e.value.message
    assert "partition" in (e.value.hint or "") and "cpu_bind" in (e.value.hint or "")


@pytest.mark.parametrize(
    "text, needle",
    [
        ("[x]\ngpus_per_node = \"four\"\n", "non-negative integer"),
        ("[x]\ngpus_per_node = true\n", "non-negative integer"),
        ("[x]\nmodules = [1, 2]\n", "list of strings"),
        ("[x]\nenv = \"A=1\"\n", "table"),
        ("[x]\nenv = { \"A-B\" = \"1\" }\n", "not a valid variable name"),
        ("[x]\nscheduler = \"lsf\"\n", "not valid"),
        ("[x]\nnetwork = \"warp\"\n", "not a network preset"),
        ("x = 1\n", "not a profile table"),
        ("[x\n", "not valid TOML"),
        ("[x]\nextends = \"x\"\n", "extends itself"),
    ],
)
def test_ill_typed_values(tmp_path: Path, text: str, needle: str) -> None:
    env = env_with(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        get_profile("x", env)
    assert needle in str(e.value)


def test_profiles_file_not_utf8_is_a_config_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from torchhpc.cli.main import main

    path = tmp_path / "profiles.toml"
    path.write_bytes('[x]\naccount = "caf\u00e9"\n'.encode("latin-1"))
    env = {"TORCHHPC_PROFILES": str(path), "HOME": str(tmp_path)}
    with pytest.raises(ConfigError) as e:
        list_profiles(env)
    assert str(path) in e.value.message and "not UTF-8" in e.value.message and "0xe9 on line 2" in e.value.message
    assert "UTF-8" in (e.value.hint or "")
    monkeypatch.setenv("TORCHHPC_PROFILES", str(path))
    assert main(["profiles", "list"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"Error: {path} is not UTF-8 text") and "HINT: save it as UTF-8" in err and "Traceback" not in err


def test_unknown_profile_lists_names(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as e:
        get_profile("marenostrum", {"HOME": str(tmp_path)})
    assert "mn5" in (e.value.hint or "") and "rcp" in (e.value.hint or "")


def test_paths(tmp_path: Path) -> None:
    assert user_profile_paths({"HOME": "/home/u"}) == [Path("/home/u/.config/torchhpc/profiles.toml")]
    assert user_profile_paths({"XDG_CONFIG_HOME": "/cfg", "HOME": "/h"}) == [Path("/cfg/torchhpc/profiles.toml")]
    with pytest.raises(ConfigError):
        list_profiles({"TORCHHPC_PROFILES": str(tmp_path / "missing.toml")})
    # The default location missing is fine: built-ins only.
    assert list_profiles({"HOME": str(tmp_path)})[0] == "mn5"


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from torchhpc.cli.main import main

    monkeypatch.setenv("TORCHHPC_PROFILES", str(tmp_path / "p.toml"))
    (tmp_path / "p.toml").write_text('[mine]\nextends = "sockeye"\naccount = "st-abc-1-gpu"\n')
    assert main(["profiles", "list"]) == 0
    out = capsys.readouterr().out
    assert "lumi" in out and "mine" in out and "(user)" in out
    assert main(["profiles", "show", "lumi"]) == 0
    assert "mask_cpu:0xfe000000000000" in capsys.readouterr().out
    assert main(["profiles", "show", "mine", "--json"]) == 0
    assert '"account": "st-abc-1-gpu"' in capsys.readouterr().out
    assert main(["profiles", "show", "nope"]) == 2


def test_a_profiles_module_lines_are_indented_in_main(capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """LUMI's `module load` lines sat at column 0 inside main() (issue 51, item 9); a heredoc in the setup
    keeps its body and end word as written (an indented end word would not end it)."""
    import subprocess

    from torchhpc.cli.main import main
    from torchhpc.core.spec import Entrypoint, JobSpec
    from torchhpc.schedulers.slurm.slurm import SlurmScheduler

    monkeypatch.setenv("SBATCH_ACCOUNT", "project_465001726")
    assert main(["run", "--dry-run", "--profile", "lumi", "--nodes", "2", "--time", "00:05:00", "--output-dir", "/scratch/demo",
                 "examples/mnist_ddp.py"]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = lines.index("main() {")
    assert lines[at + 1: at + 4] == ["  set +u", "  module load LUMI/24.03",
                                     "  module load PyTorch/2.3.1-rocm-6.0.3-python-3.12-singularity-20240923"]
    assert not any(ln.startswith("module ") for ln in lines)
    setup = ("module load a", "cat > notes.txt <<'EOF'", "  kept as written", "EOF", "module load b")
    text = SlurmScheduler().render_script(JobSpec(entrypoint=Entrypoint.parse(["pi.py"], python="python3"),
                                                  scheduler="slurm", output_dir="/scratch/o", setup=setup))
    body = text.splitlines()
    assert "  module load a" in body and "  module load b" in body and "  cat > notes.txt <<'EOF'" in body
    i = body.index("  cat > notes.txt <<'EOF'")
    assert body[i + 1: i + 3] == ["  kept as written", "EOF"]
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0
