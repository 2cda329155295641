"""Issue 18: profiles satisfied by real flags, safe defaults, the config file, help for users.

Every test runs the real CLI entry point (``main([...])``) or the library
function behind it, with HOME and XDG_CONFIG_HOME pointing at a temporary
directory so no user file on this machine changes the answer.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

from torchhpc.cli.main import build_parser, main
from torchhpc.core.spec import Entrypoint, JobSpec
from torchhpc.errors import SpecError, UsageError
from torchhpc.resolve import build_spec


@pytest.fixture(autouse=True)
def clean_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    import os

    for k in list(os.environ):
        if k.startswith("TORCHHPC_") or k.startswith("SBATCH_"):
            monkeypatch.delenv(k)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.setenv("TORCHHPC_STATE_DIR", str(tmp_path / "state"))
    return home


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


# --- profiles ---------------------------------------------------------------------------------


def test_mn5_renders_with_real_flags(capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's command failed with "requires --time / HINT: add --time NAME"."""
    rc, out, err = run_cli(
        ["run", "--profile", "mn5", "-A", "X", "--qos", "Y", "--time", "00:30:00", "--dry-run", "examples/pi.py"], capsys
    )
    assert rc == 0, err
    for line in ("#SBATCH --account=X", "#SBATCH --qos=Y", "#SBATCH --time=00:30:00", "#SBATCH --gpus-per-node=4"):
        assert line in out
    assert "module load singularity" in out
    # No image: the dry run still renders, and says that submitting would stop.
    assert "no image was given" in err and "--container IMAGE" in err


@pytest.mark.parametrize("missing, flag", [("--time", "--time HH:MM:SS"), ("--qos", "--qos QOS"), ("-A", "--account ACCOUNT")])
def test_requirement_hint_names_the_flag(missing: str, flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["run", "--profile", "mn5", "-A", "X", "--qos", "Y", "--time", "00:30:00", "--dry-run", "examples/pi.py"]
    i = argv.index(missing)
    del argv[i : i + 2]
    rc, _, err = run_cli(argv, capsys)
    assert rc == 2
    assert f"requires {flag.split()[0]}" in err and f"HINT: add {flag}" in err
    assert "NAME" not in err.split("HINT:")[1].split("(")[0]


def test_requirement_from_config_file_and_env(clean_home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = clean_home / ".config" / "torchhpc"
    cfg.mkdir(parents=True)
    (cfg / "config.toml").write_text('account = "bsc98"\nqos = "acc_debug"\n')
    monkeypatch.setenv("TORCHHPC_TIME", "00:10:00")
    rc, out, err = run_cli(["run", "--profile", "mn5", "--dry-run", "--no-container", "examples/pi.py"], capsys)
    assert rc == 0, err
    assert "#SBATCH --account=bsc98" in out and "#SBATCH --qos=acc_debug" in out and "#SBATCH --time=00:10:00" in out


def test_profiles_list_without_user_file_marks_nothing_user(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run_cli(["profiles", "list"], capsys)
    assert rc == 0 and "mn5" in out and "sockeye" in out
    assert "(user)" not in out


def test_lumi_faithful_to_seed_002(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    base = ["run", "--profile", "lumi", "--nodes", "4", "--dry-run", "examples/pi.py"]
    rc, _, err = run_cli(base, capsys)
    assert rc == 2 and "requires --account" in err  # consistent with mn5 and alliance-cc
    rc, _, err = run_cli([*base[:1], "--account", "project_465001726", *base[1:]], capsys)
    assert rc == 2 and "requires --time" in err  # the seed sets --time=5:00
    # The seed's own way of giving the account: SBATCH_ACCOUNT, read by sbatch itself.
    monkeypatch.setenv("SBATCH_ACCOUNT", "project_465001726")
    rc, out, err = run_cli([*base[:1], "--time", "00:05:00", *base[1:]], capsys)
    assert rc == 0, err
    assert "singularity exec" in out
    assert "--rocm" not in out  # the seed's `singularity exec $SIFPYTORCH` has none
    assert "#SBATCH --time=00:05:00" in out and "#SBATCH --mem=480G" in out


def test_profile_runtime_without_image_refuses_when_submitting() -> None:
    from torchhpc.profiles import Profile

    values = {"profile": "mn5", "account": "a", "qos": "q", "time": "10"}
    with pytest.raises(UsageError) as e:
        build_spec(values, ["examples/pi.py"], {"HOME": "/nonexistent"})
    assert "singularity" in e.value.message and "--no-container" in (e.value.hint or "")
    spec = build_spec({**values, "no_container": True}, ["examples/pi.py"], {"HOME": "/nonexistent"})
    assert spec.container is None
    spec = build_spec({**values, "container": "mn5.sif"}, ["examples/pi.py"], {"HOME": "/nonexistent"})
    assert spec.container is not None and spec.container.runtime == "singularity"
    # A profile may say the host is fine.
    assert Profile.from_mapping("x", {"container_optional": True}, "t").container_optional is True


def test_runtime_without_image_refuses(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run_cli(["run", "--scheduler", "slurm", "--runtime", "podman", "--dry-run", "examples/pi.py"], capsys)
    assert rc == 2 and "--runtime podman needs an image" in err


# --- safe defaults ----------------------------------------------------------------------------


def test_mem_without_unit_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run_cli(["run", "--scheduler", "slurm", "--mem", "64", "--dry-run", "examples/pi.py"], capsys)
    assert rc == 2 and out == ""
    assert "--mem='64' has no unit" in err and "HINT: write the unit: --mem 64G" in err
    with pytest.raises(SpecError):
        JobSpec(Entrypoint.parse(["x.py"]), mem="64")
    assert JobSpec(Entrypoint.parse(["x.py"]), mem="64G").mem == "64G"


def test_dash_n_with_several_nodes_is_ambiguous(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run_cli(["run", "-s", "slurm", "-N", "2", "-n", "8", "--launcher", "srun", "--dry-run", "x.py"], capsys)
    assert rc == 2 and out == ""
    assert "ambiguous" in err and "--nproc-per-node 8" in err and "--ntasks 8" in err
    rc, out, _ = run_cli(["run", "-s", "slurm", "-N", "2", "--ntasks", "8", "--launcher", "srun", "--dry-run", "x.py"], capsys)
    assert rc == 0 and "#SBATCH --ntasks-per-node=4" in out
    rc, _, err = run_cli(["run", "-s", "slurm", "-N", "2", "--ntasks", "7", "--dry-run", "x.py"], capsys)
    assert rc == 2 and "cannot be divided evenly" in err
    rc, out, _ = run_cli(["run", "-s", "slurm", "-N", "2", "--nproc-per-node", "8", "--launcher", "srun", "--dry-run", "x.py"], capsys)
    assert rc == 0 and "#SBATCH --ntasks-per-node=8" in out
    rc, out, _ = run_cli(["run", "-s", "slurm", "-n", "3", "--launcher", "srun", "--dry-run", "x.py"], capsys)
    assert rc == 0 and "#SBATCH --ntasks-per-node=3" in out  # one node: -n is unambiguous


# --- config file ------------------------------------------------------------------------------


def test_config_file_precedence_and_show(clean_home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    xdg = clean_home / "xdg"
    (xdg / "torchhpc").mkdir(parents=True)
    (xdg / "torchhpc" / "config.toml").write_text('scheduler = "slurm"\npartition = "gpu"\ntime = "01:00:00"\n')
    monkeypatch.setenv("XDG_CONFIG_HOME", str(xdg))
    rc, out, _ = run_cli(["run", "--dry-run", "x.py"], capsys)
    assert rc == 0 and "#SBATCH --partition=gpu" in out and "#SBATCH --time=01:00:00" in out
    monkeypatch.setenv("TORCHHPC_PARTITION", "big")
    rc, out, _ = run_cli(["run", "--time", "5", "--dry-run", "x.py"], capsys)
    assert "#SBATCH --partition=big" in out and "#SBATCH --time=00:05:00" in out
    # A profile's facts beat the file (lumi's partition, not the one from home).
    rc, out, err = run_cli(["run", "--profile", "lumi", "-A", "p", "--dry-run", "x.py"], capsys)
    assert rc == 0, err
    assert "#SBATCH --partition=standard-g" not in out  # TORCHHPC_PARTITION=big still wins over the profile
    assert "#SBATCH --partition=big" in out and "#SBATCH --time=01:00:00" in out
    rc, out, _ = run_cli(["config", "show", "--json"], capsys)
    data = json.loads(out)
    assert data["scheduler"] == {"value": "slurm", "source": f"config file ({xdg / 'torchhpc' / 'config.toml'})", "config_key": True}
    assert data["partition"]["source"] == "$TORCHHPC_PARTITION"
    assert data["account"] == {"value": None, "source": "built-in default", "config_key": True}
    rc, out, _ = run_cli(["config", "show", "--profile", "mn5"], capsys)
    assert rc == 0 and re.search(r"^gpus_per_node\s+4\s+profile mn5$", out, re.M)


def test_config_file_errors(clean_home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = clean_home / ".config" / "torchhpc"
    cfg.mkdir(parents=True)
    (cfg / "config.toml").write_text('partiton = "gpu"\n')
    rc, _, err = run_cli(["run", "--dry-run", "x.py"], capsys)
    assert rc == 2 and "unknown key 'partiton'" in err and "partition" in err
    (cfg / "config.toml").write_text('scheduler = "lsf"\n')
    rc, _, err = run_cli(["config", "show"], capsys)
    assert rc == 2 and "not a scheduler" in err


def test_config_file_not_utf8_is_a_config_error(clean_home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = clean_home / ".config" / "torchhpc"
    cfg.mkdir(parents=True)
    (cfg / "config.toml").write_bytes(b'scheduler = "slurm"\npartition = "gpu\xff"\n')
    rc, _, err = run_cli(["config", "show"], capsys)
    assert rc == 2 and "Traceback" not in err
    assert err.startswith(f"Error: {cfg / 'config.toml'} is not UTF-8 text (byte 0xff on line 2)")
    assert "HINT: save it as UTF-8" in err


# --- lifecycle CLI ----------------------------------------------------------------------------


@pytest.mark.parametrize("sched, native", [("runai", "runai list jobs")])
def test_list_never_returns_silently(sched: str, native: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run_cli(["list", "-s", sched], capsys)
    assert rc == 2 and native in err
    rc, out, _ = run_cli(["list", "-s", sched, "--json"], capsys)
    assert rc == 2 and native in json.loads(out)["hint"]


def test_kubernetes_list_without_a_cluster_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    """`list -s kubernetes` asks the cluster (tests/unit/test_trainjob.py lists through a fake API); with no
    cluster reachable here (no kubectl, or one with no context) it fails naming kubectl, never silently."""
    rc, out, err = run_cli(["list", "-s", "kubernetes"], capsys)
    assert rc != 0 and "kubectl" in err and "Traceback" not in err
    rc, out, _ = run_cli(["list", "-s", "kubernetes", "--json"], capsys)
    data = json.loads(out)
    assert rc != 0 and "kubectl" in f"{data['error']} {data['hint']}"


def test_status_json_error_is_json(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run_cli(["status", "--json", "local:nosuchjob"], capsys)
    assert rc != 0 and err == ""
    data = json.loads(out)
    assert "nosuchjob" in data["error"] and data["exit_code"] == rc


# --- help -------------------------------------------------------------------------------------


def _walk(p: argparse.ArgumentParser, path: list[str]):  # type: ignore[no-untyped-def]
    yield path, p.format_help()
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sp in a.choices.items():
                yield from _walk(sp, [*path, name])


def test_no_rst_in_any_help() -> None:
    bad = []
    for path, text in _walk(build_parser(), ["torchhpc"]):
        for m in re.finditer(r":[a-z]+:`|``", text):
            bad.append(f"{' '.join(path)}: ...{text[max(0, m.start() - 30):m.end() + 30]!r}")
    assert not bad, "\n".join(bad)


# --- program, GPUs, API, --json, --plot --------------------------------------------------------


def test_missing_program_is_refused_before_submitting(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for argv in (["run", "-n", "2", "missing.py"], ["run", "-s", "slurm", "-N", "2", "--nproc-per-node", "2", "missing.py"],
                 ["run", "-s", "pbs", "missing.py"]):
        rc, out, err = run_cli(argv, capsys)
        assert rc == 2 and out == "", argv
        assert err.splitlines()[0] == f"Error: the program 'missing.py' does not exist (from {tmp_path})"
        assert "Traceback" not in err and "sbatch" not in err and "qsub" not in err
    rc, _, err = run_cli(["run", "-n", "2", "--", "no-such-command-here"], capsys)
    assert rc == 2 and "not on PATH" in err
    # A dry run still renders (the script may be written later), and pods carry their own files.
    rc, out, _ = run_cli(["run", "-s", "slurm", "--dry-run", "missing.py"], capsys)
    assert rc == 0 and "missing.py" in out


def test_program_in_a_directory_image_is_checked_inside_it(tmp_path: Path) -> None:
    from torchhpc.core.spec import ContainerSpec
    from torchhpc.job import check_program

    image = tmp_path / "img"
    (image / "app").mkdir(parents=True)
    (image / "app" / "train.py").write_text("")
    spec = JobSpec(Entrypoint.parse(["/app/train.py"]), scheduler="slurm",
                   container=ContainerSpec(str(image), runtime="charliecloud"))
    check_program(spec)
    with pytest.raises(SpecError):
        check_program(spec.with_(entrypoint=Entrypoint.parse(["/app/nope.py"])))
    # A SIF cannot be looked into from here: an absolute path is left to the job.
    check_program(spec.with_(entrypoint=Entrypoint.parse(["/app/nope.py"]), container=ContainerSpec("x.sif")))


def test_gpus_requested_where_none_are_visible_warns(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from torchhpc.job import visible_gpus

    fake = tmp_path / "root"
    (fake / "proc/driver/nvidia/gpus/0000:01:00.0").mkdir(parents=True)
    (fake / "sys/class/kfd/kfd/topology/nodes/1").mkdir(parents=True)
    (fake / "sys/class/kfd/kfd/topology/nodes/1/gpu_id").write_text("4660\n")
    assert visible_gpus("nvidia", str(fake)) == 1 and visible_gpus("amd", str(fake)) == 1
    assert visible_gpus("nvidia", str(tmp_path / "empty")) == 0
    if visible_gpus("nvidia") or visible_gpus("amd"):
        pytest.skip("this machine has GPUs")  # the warning is for machines without any
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    rc, _, err = run_cli(["run", "-n", "1", "--gpus-per-node", "2", "--", "true"], capsys)
    assert rc == 0
    assert err.startswith("Warning: --gpus-per-node 2 but this machine shows no nvidia GPU")


def test_job_api_profile_and_name(monkeypatch: pytest.MonkeyPatch) -> None:
    from torchhpc.job import Job

    job = Job(["examples/pi.py"], profile="mn5", account="bsc98", qos="acc_debug", time="00:30:00", nodes=2,
              container=__import__("torchhpc.core.spec", fromlist=["ContainerSpec"]).ContainerSpec("mn5.sif", runtime="singularity"))
    assert job.spec.name == "pi"  # as the CLI names it, not "torchhpc"
    assert job.spec.scheduler == "slurm" and job.spec.gpus_per_node == 4 and job.spec.nproc_per_node == 4
    script = job.render().script or ""
    assert "#SBATCH --account=bsc98" in script and "singularity exec --nv" in script
    with pytest.raises(UsageError) as e:
        Job(["examples/pi.py"], profile="mn5", account="bsc98", qos="q")
    assert "requires --time" in e.value.message
    assert Job(["examples/pi.py"], nproc_per_node=2).spec.name == "pi"
    with pytest.raises(TypeError):
        Job(["examples/pi.py"], nprocs=2)


def test_run_json(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run_cli(["run", "--json", "-s", "slurm", "--dry-run", "examples/pi.py"], capsys)
    data = json.loads(out)
    assert rc == 0 and data["argv"][0] == "sbatch" and "#SBATCH --job-name=pi" in data["script"]
    rc, out, err = run_cli(["run", "--json", "-s", "slurm", "-N", "2", "-n", "2", "--dry-run", "examples/pi.py"], capsys)
    assert rc == 2 and err == "" and "ambiguous" in json.loads(out)["error"]


def test_plot_without_matplotlib_fails_before_the_run(tmp_path: Path) -> None:
    """`python -S` hides site-packages: matplotlib (and torch) are really absent; the check comes first."""
    import subprocess
    import sys

    src = Path(__file__).resolve().parents[2] / "src"
    code = "import sys; from torchhpc.cli.main import main; sys.exit(main(['bench', 'run', '--plot', 'x.png']))"
    done = subprocess.run([sys.executable, "-S", "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("Error: --plot needs matplotlib") and "Traceback" not in done.stderr


def test_gpus_checked_against_sinfo() -> None:
    """sinfo answers are recorded formats (the dev cluster has no GPUs: tests/integration covers that for real)."""
    from tests.fakes import FakeRunner
    from torchhpc.job import check_gpus
    from torchhpc.schedulers.slurm.nodes import gres_gpus as _gres_gpus

    assert [_gres_gpus(g) for g in ("(null)", "gpu:4", "gpu:a100:4(S:0-1)", "gpu:h100:4,shard:8", "gpu:2,gpu:a:8")] == [0, 4, 4, 4, 8]
    runner = FakeRunner(responses={"sinfo": "cpu*|(null)\nacc|gpu:h100:4(S:0-3)\n"})
    spec = JobSpec(Entrypoint.parse(["x.py"]), scheduler="slurm", gpus_per_node=4, nproc_per_node=4)
    with pytest.raises(SpecError) as e:
        check_gpus(spec, runner)  # the default partition (cpu*) has none
    assert "partition cpu has no GPUs" in e.value.message and "--partition" in (e.value.hint or "")
    check_gpus(spec.with_(options=(("partition", "acc"),)), runner)
    with pytest.raises(SpecError, match="partition acc has at most 4 GPUs per node"):
        check_gpus(spec.with_(gpus_per_node=8, nproc_per_node=8, options=(("partition", "acc"),)), runner)
    check_gpus(spec, FakeRunner(responses={}))  # no sinfo: sbatch judges


def test_list_defaults_to_local(capsys: pytest.CaptureFixture[str]) -> None:
    """`list` asked Slurm even where local is the default scheduler."""
    rc, _, err = run_cli(["list"], capsys)
    assert rc == 0 and "no local jobs" in err


@pytest.mark.parametrize("argv, cpus", [
    (["--profile", "alliance-cc", "-A", "def-pi", "--nodes", "2"], "4"),  # torchrun: 4 workers x 1
    (["-s", "slurm", "--nproc-per-node", "3", "--launcher", "srun"], "1"),
    (["-s", "slurm", "--nproc-per-node", "3", "--launcher", "mpirun", "--cpus-per-proc", "2"], "2"),
    (["-s", "slurm", "--nproc-per-node", "3", "--cpus-per-proc", "2"], "6"),
])
def test_cpus_per_task_always_rendered(argv: list[str], cpus: str, capsys: pytest.CaptureFixture[str]) -> None:
    """alliance-cc rendered no --cpus-per-task: torchrun's workers shared Slurm's default of one CPU."""
    rc, out, err = run_cli(["run", "--dry-run", *argv, "examples/pi.py"], capsys)
    assert rc == 0, err
    assert f"#SBATCH --cpus-per-task={cpus}" in out
    if "mpirun" not in argv:  # one mpirun in the batch step: its ranks use the allocation's CPUs
        assert f"--cpus-per-task={cpus} --label" in out  # and on the srun step


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_completion_generated_from_the_parser(shell: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import shutil
    import subprocess

    rc, out, _ = run_cli(["completion", shell], capsys)
    assert rc == 0 and "complete -o default -F _torchhpc torchhpc" in out
    script = tmp_path / "c.sh"
    script.write_text(out)
    if shell == "zsh":
        return  # zsh is not installed here; the bash function it loads through bashcompinit is checked below
    from tests.golden_util import lint_script

    lint_script(out, tmp_path)
    assert shutil.which("bash")

    def complete(*words: str) -> list[str]:
        probe = f'source {script}; COMP_WORDS=({" ".join(words)}); COMP_CWORD={len(words) - 1}; _torchhpc; ' \
                'printf "%s\\n" "${COMPREPLY[@]}"'
        return subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=True).stdout.split()

    assert set(complete("torchhpc", "con")) == {"container", "config"}
    assert complete("torchhpc", "net", "de") == ["detect"]
    assert "--profile" in complete("torchhpc", "run", "--pro")
    assert "--ntasks" in complete("torchhpc", "run", "--nt") and "--no-container" in complete("torchhpc", "run", "--no")


def test_slurm_without_configuration_gets_a_hint(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Slurm's "Could not establish a configuration source" came with no HINT."""
    from torchhpc.errors import CommandError

    e = CommandError(["squeue"], 1, "squeue: fatal: Could not establish a configuration source\n")
    assert e.hint is not None and "SLURM_CONF" in e.hint
    assert CommandError(["squeue"], 1, "other").hint is None
    e = CommandError(["sbatch"], 1, "sbatch: error: s_p_parse_file: cannot stat file /x/slurm.conf: No such file\n"
                     "sbatch: fatal: Unable to process configuration file\n")
    assert e.hint is not None and "SLURM_CONF" in e.hint
    import os
    import shutil

    no_conf = not any(os.path.exists(p) for p in ("/etc/slurm/slurm.conf", "/etc/slurm-llnl/slurm.conf"))
    if shutil.which("scontrol") and no_conf:  # the real client, with no configuration to find
        monkeypatch.delenv("SLURM_CONF", raising=False)  # and no /etc/slurm here: the situation
        # and no dev cluster to fall back on (CI runs one: the CLI would talk to it)
        monkeypatch.setenv("TORCHHPC_DEVCLUSTER_DIR", "/nonexistent/torchhpc-devcluster")
        rc, out, _ = run_cli(["status", "--json", "slurm:1"], capsys)
        data = json.loads(out)
        assert rc == 1 and data["hint"] and "SLURM_CONF" in data["hint"], data
