"""The rank boot directory (src/torchhpc/launchers/boot.py, src/torchhpc/boot/sitecustomize.py), for real.

Every test starts real interpreters through the real per-task shim (bash, which puts the batch
script's ``$TORCHHPC_BOOT_DIR`` first), the real shell lines of pods and local containers (which
write the directory) or the local scheduler's PYTHONPATH: a planted sitecustomize in a real venv still runs, the switch turns the cure off, a
program that never imports torch does not get torch imported, the hook wraps the real
torch.distributed, and a real two-rank gloo job that destroys its group at the end finishes. The
destroy guard's watchdog is checked against a stand-in ``torch.distributed`` whose destroy never
returns (the real deadlock cannot be produced on demand; the soak, benchmarks/soak_compat.py, runs
the real one).
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

from tests.conftest import load_file, need, reaped
from torchhpc.launchers import TASK_SH
from torchhpc.launchers.boot import BOOT_DIR, boot_argv, boot_hash, boot_pythonpath, boot_shell

PROBE = (
    "import sys; b = sys.modules.get('_torchhpc_boot'); "
    "print('boot', b is not None, 'torch', 'torch' in sys.modules, "
    "'finder', any(type(f).__name__ == 'Finder' for f in sys.meta_path))"
)


def shim_run(argv: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``argv`` through the shell lines that write the boot directory (pods, local containers), private TMPDIR."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHHPC_", "SLURM_", "OMPI_", "PMI_"))}
    full.update({"TMPDIR": str(tmp_path), **env})
    return subprocess.run(boot_argv(argv), env=full, capture_output=True, text=True, timeout=120)


def task_run(argv: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    """``argv`` through the task shim of the batch scripts (no launcher: one process)."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHHPC_", "SLURM_", "OMPI_", "PMI_"))}
    return subprocess.run(["bash", TASK_SH, "auto", *argv], env={**full, **env}, capture_output=True,
                          text=True, timeout=120)


def test_the_task_shim_puts_the_scripts_boot_dir_first(tmp_path: Path) -> None:
    """The batch script exports TORCHHPC_BOOT_DIR (installed, or the copy in the output directory)."""
    copy = tmp_path / ".torchhpc-boot-x"
    copy.mkdir()
    (copy / "sitecustomize.py").write_text(Path(BOOT_DIR, "sitecustomize.py").read_text())
    r = task_run([sys.executable, "-c", PROBE + "; print(sys.path[1])"], TORCHHPC_BOOT_DIR=str(copy),
                 PYTHONPATH="/elsewhere")
    assert r.stdout.splitlines() == ["boot True torch False finder True", str(copy)], r.stderr
    r = task_run(["sh", "-c", 'echo "$PYTHONPATH"'], TORCHHPC_BOOT_DIR=str(copy), PYTHONPATH="/a",
                 TORCHHPC_EXIT_CURE="0")
    assert r.stdout.strip() == "/a"
    r = task_run(["sh", "-c", 'echo "$PYTHONPATH"'], PYTHONPATH="/a")  # no script around it: nothing added
    assert r.stdout.strip() == "/a" and not r.stderr


def test_shim_writes_a_private_boot_dir_and_puts_it_first(tmp_path: Path) -> None:
    r = shim_run([sys.executable, "-c", PROBE + "; print(sys.path[1])"], tmp_path, PYTHONPATH="/elsewhere")
    assert r.returncode == 0, r.stderr
    boot = tmp_path / f"torchhpc-boot-{os.getuid()}-{boot_hash()}"
    assert r.stdout.splitlines() == ["boot True torch False finder True", str(boot)]
    assert (boot / "sitecustomize.py").read_text() == Path(BOOT_DIR, "sitecustomize.py").read_text()
    assert boot.stat().st_mode & 0o777 == 0o700
    # the temporary name was renamed (Python may add its __pycache__ beside the file)
    assert [p.name for p in boot.iterdir() if p.name != "__pycache__"] == ["sitecustomize.py"]


def test_switch_off_leaves_pythonpath_alone(tmp_path: Path) -> None:
    r = shim_run(["sh", "-c", 'echo "$PYTHONPATH"'], tmp_path, PYTHONPATH="/elsewhere", TORCHHPC_EXIT_CURE="0")
    assert r.stdout.strip() == "/elsewhere"
    assert not list(tmp_path.iterdir())
    assert boot_pythonpath({"TORCHHPC_EXIT_CURE": "off"}) is None
    # and where the directory is on sys.path anyway, the file itself obeys the switch
    env = {**os.environ, "PYTHONPATH": BOOT_DIR, "TORCHHPC_EXIT_CURE": "0"}
    r = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "boot True torch False finder False", r.stderr


def test_a_planted_link_is_not_followed(tmp_path: Path) -> None:
    """Someone else's directory (here: a symlink planted at the name) is never put on PYTHONPATH."""
    evil = tmp_path / "evil"
    evil.mkdir()
    (evil / "sitecustomize.py").write_text("print('planted code ran')\n")
    (tmp_path / f"torchhpc-boot-{os.getuid()}-{boot_hash()}").symlink_to(evil)
    r = shim_run([sys.executable, "-c", "print('ok')"], tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr
    assert "torchhpc: no exit cure in this rank" in r.stderr


def test_a_venvs_own_sitecustomize_still_runs(tmp_path: Path) -> None:
    """A real venv (sharing this interpreter's packages) with a sitecustomize planted in its site-packages."""
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(system_site_packages=True, with_pip=False, symlinks=True).create(env_dir)
    python = env_dir / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    marker = tmp_path / "marker"
    Path(site, "sitecustomize.py").write_text(
        f"import sys\nopen({str(marker)!r}, 'w').write('planted ' + str('_torchhpc_boot' in sys.modules))\n"
    )
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    # Without the boot, Python imports the first sitecustomize on its path: the planted one, or the
    # interpreter's own where its stdlib has one (Debian's python3 does). With the boot, that same one runs.
    plain = subprocess.run([str(python), "-c", "import sitecustomize; print(sitecustomize.__file__)"],
                           capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    r = shim_run([str(python), "-c", PROBE + "; import sitecustomize; print(sitecustomize.__file__)"], tmp)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["boot True torch False finder True", plain]
    if plain == str(Path(site, "sitecustomize.py")):
        assert marker.read_text() == "planted True"  # ran, after the boot
    else:
        assert plain.startswith(sys.base_prefix) and not marker.exists()  # shadowed by the stdlib's, as without us


def test_local_ranks_get_the_package_dir_and_containers_the_shell_lines() -> None:
    path = boot_pythonpath({"PYTHONPATH": f"/a{os.pathsep}{BOOT_DIR}"})
    assert path == f"{BOOT_DIR}{os.pathsep}/a"  # first, once
    argv = boot_argv(["python3", "t.py"])
    assert argv[:2] == ["sh", "-c"] and argv[2] == boot_shell() + 'exec "$@"' and argv[3:] == ["torchhpc-boot", "python3", "t.py"]
    shim = Path(TASK_SH).read_text()
    assert 'export PYTHONPATH="$TORCHHPC_BOOT_DIR' in shim and "TORCHHPC_BOOT_PY" not in shim  # the shim carries no Python


def test_the_hook_wraps_the_real_torch_distributed() -> None:
    need("torch")
    code = (
        "import atexit, sys\n"
        "import torch.distributed as dist\n"
        "from torch.distributed import distributed_c10d as c10d\n"
        "print(getattr(dist.destroy_process_group, '_torchhpc_guard', False),"
        " getattr(c10d.destroy_process_group, '_torchhpc_guard', False),"
        " any(type(f).__name__ == 'Finder' for f in sys.meta_path))\n"
    )
    env = {**os.environ, "PYTHONPATH": BOOT_DIR}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.stdout.strip() == "True True False", r.stderr  # both wrapped; the finder removed itself


GLOO_DESTROY = """
import os, sys
import torch, torch.distributed as dist
dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64))
for _ in range(5):
    model(torch.randn(8, 64)).sum().backward()
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
dist.destroy_process_group()
print("done", dist.get_rank() if dist.is_initialized() else os.environ["RANK"], t.item(), flush=True)
"""


def test_two_gloo_ranks_that_destroy_their_group_finish(tmp_path: Path) -> None:
    need("torch")
    script = tmp_path / "destroy.py"
    script.write_text(GLOO_DESTROY)
    from torchhpc.schedulers.local.ranks import free_port

    port = str(free_port())
    procs = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
               "LOCAL_RANK": str(rank), "PYTHONPATH": boot_pythonpath(dict(os.environ)) or "", "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    with reaped(procs):
        outs = [p.communicate(timeout=600) for p in procs]  # 14 s here when quiet, 120 s beside busy loops
    for rank, (p, (out, err)) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, err[-2000:]
        assert out.strip() == f"done {rank} 3.0"
        assert "deprecated" not in err, err[-2000:]  # the recorder's variables are the names this torch reads


def test_the_destroy_guard_ends_a_destroy_that_never_returns(tmp_path: Path) -> None:
    """A stand-in torch.distributed whose destroy spins holding the GIL: the watchdog exits the rank."""
    fake = tmp_path / "fake" / "torch"
    (fake / "distributed").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "distributed" / "__init__.py").write_text(
        "def destroy_process_group(group=None):\n    while True:\n        pass\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([BOOT_DIR, str(tmp_path / "fake")]),
           "TORCHHPC_DESTROY_TIMEOUT": "1"}
    code = "import torch.distributed as d; print('destroying', flush=True); d.destroy_process_group()"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stdout.strip() == "destroying"
    assert "Timeout (0:00:01)!" in r.stderr and "in destroy_process_group" in r.stderr, r.stderr


def test_torchhpc_exec_boots_the_rank_too() -> None:
    """``srun torchhpc exec -- python ...`` (torchhpc installed where the task runs): the package's boot dir."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHHPC_", "SLURM_", "OMPI_", "PMI_"))}
    r = subprocess.run([sys.executable, "-m", "torchhpc", "exec", "--", sys.executable, "-c", PROBE], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.stdout.strip() == "boot True torch False finder True", r.stderr
    r = subprocess.run([sys.executable, "-m", "torchhpc", "exec", "--", sys.executable, "-c", PROBE],
                       env={**env, "TORCHHPC_EXIT_CURE": "0"}, capture_output=True, text=True, timeout=120)
    assert r.stdout.strip().startswith("boot False"), r.stderr


def test_the_recorder_uses_the_variable_names_of_the_torch_it_finds(tmp_path: Path) -> None:
    """torch 2.7 renamed TORCH_NCCL_TRACE_BUFFER_SIZE (and warns on every rank when it is set); 2.5 reads only it."""
    boot = load_file(Path(BOOT_DIR, "sitecustomize.py"), "_boot_copy")
    for name, text in (("new", "__version__ = '2.13.0+cpu'\n"), ("ngc", '__version__ = "2.5.0a0+b465a5843b.nv24.09"\n')):
        (tmp_path / name / "torch").mkdir(parents=True)
        (tmp_path / name / "torch" / "version.py").write_text("from typing import Optional\n" + text)
    assert boot.torch_version([str(tmp_path / "none"), str(tmp_path / "new")]) == (2, 13)
    assert boot.torch_version([str(tmp_path / "ngc")]) == (2, 5)
    assert boot.torch_version([str(tmp_path / "none")]) is None
    for where, want in (("new", {"TORCH_FR_BUFFER_SIZE", "TORCH_FR_DUMP_TEMP_FILE"}),
                        ("ngc", {"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE",
                                 "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"})):
        env = {"TORCHHPC_RANKS_DIR": "/j/ranks"}
        old_path = sys.path[:]
        sys.path[:] = [str(tmp_path / where)]
        try:
            boot.flight_env(env)
        finally:
            sys.path[:] = old_path
        assert {k for k in env if k.startswith("TORCH_") and k != "TORCH_NCCL_DUMP_ON_TIMEOUT"} == want, env


def test_a_dry_run_names_the_boot_copy_in_two_lines(tmp_path: Path) -> None:
    """A container job's dry run writes the boot copy at submit: two lines name its directory and files
    (each within 160 characters) instead of ~480 lines of the package's own text below the script. A file
    whose text is not the package's (no boot copy) is shown whole."""
    from torchhpc.core.spec import ContainerSpec, Entrypoint, JobSpec
    from torchhpc.launchers.boot import SHELL_PROGRAMS, is_boot_copy
    from torchhpc.schedulers.slurm.slurm import SlurmScheduler

    spec = JobSpec(entrypoint=Entrypoint.parse(["train.py"], python="python3"), name="t", nodes=2, launcher="srun",
                   scheduler="slurm", output_dir=str(tmp_path), container=ContainerSpec(image="img:1", runtime="enroot"))
    sub = SlurmScheduler().render(spec)
    text = str(sub)
    boot = [p for p, c in sub.files if is_boot_copy(p, c)]
    assert [os.path.basename(p) for p in boot] == ["sitecustomize.py", *SHELL_PROGRAMS]
    lines = text.splitlines()
    at = next(i for i, ln in enumerate(lines) if "torchhpc's boot copy" in ln)
    assert lines[at].startswith(f"# --- {os.path.dirname(boot[0])}/ --- ")
    assert lines[at + 1].startswith("#     ") and all(n in lines[at + 1] for n in SHELL_PROGRAMS)
    assert "GLOO_WORKER = " not in text and "_torchhpc_launcher=" not in text  # no boot file's body
    assert (sub.script or "").rstrip("\n") in text and len(text.splitlines()) < 120
    assert not is_boot_copy(boot[1], "echo changed\n") and not is_boot_copy(str(tmp_path / "rank.sh"), dict(sub.files)[boot[1]])
