"""torchhpc.dist.init() under real launchers: each rank all-reduces its rank over gloo.

Launchers: a bare Popen loop with torch's env contract, Open MPI's ``mpirun
-np 2`` (directly and through ``torchhpc exec``), real ``torchrun
--nproc_per_node 2``, ``torchhpc run -n 2``, and on the Slurm dev cluster an
sbatch job with srun-direct ranks on two nodes, mpirun inside the allocation,
and the batch script itself (which must not be taken for a rank).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from tests.conftest import PYTHON, REPO, missing, need, reaped
from torchhpc.core.shell import join
from torchhpc.jobdir.log_wiring import log_argv
from torchhpc.jobdir.logs import rank_files
from torchhpc.launchers import MPIRUN

need("torch")
# Each rank imports torch (~2 s on the shared 2-core machines): every test here takes seconds.
pytestmark = pytest.mark.slow

WORKER = r'''
import json, os, sys
import torch, torch.distributed as dist
import torchhpc.dist as thd

ctx = thd.init()
t = torch.tensor([float(ctx.rank)])
if ctx.distributed:
    dist.all_reduce(t)
# One write(2) for the whole line: bare torchrun and mpirun give every rank the same pipe, and an
# unbuffered print() writes a line in pieces that another rank's pieces can land between.
sys.stdout.flush()
os.write(1, ("RESULT " + json.dumps({
    "rank": ctx.rank, "world": ctx.world_size, "local_rank": ctx.local_rank,
    "local_world": ctx.local_world_size, "node_rank": ctx.node_rank, "source": ctx.env.source,
    "sum": t.item(), "backend": ctx.backend, "device": str(ctx.device), "is_main": ctx.is_main,
    "distributed": ctx.distributed, "group_world": dist.get_world_size() if ctx.distributed else 1,
}) + "\n").encode())
ctx.print("MAIN_ONLY")
thd.cleanup()
'''

LAUNCH_VARS = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "PBS_", "MV2_", "PET_", "RUNAI_", "TORCHELASTIC_")
TORCH_VARS = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT"}
MPI_ROOT = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_btl": "self,tcp",
    "OMPI_MCA_pml": "ob1",
}


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not (k.startswith(LAUNCH_VARS) or k in TORCH_VARS)}
    env["PYTHONPATH"] = str(REPO / "src")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def results(text: str) -> list[dict[str, object]]:
    return sorted(
        (json.loads(line.split("RESULT ", 1)[1]) for line in text.splitlines() if "RESULT " in line),
        key=lambda r: int(r["rank"]),  # type: ignore[call-overload]
    )


def per_rank(command: list[str], ranks_dir: Path) -> list[str]:
    """``command`` run by torchhpc's per-rank log wrapper (each mpirun rank writes its own file):
    mpirun forwards all ranks through one pipe and splices their lines, the files keep them whole."""
    ranks_dir.mkdir(exist_ok=True)
    return ["env", f"TORCHHPC_RANKS_DIR={ranks_dir}", *log_argv(command, MPIRUN.rank_vars)]


def rank_text(ranks_dir: Path) -> str:
    return "".join(Path(path).read_text() for path, _node in rank_files(str(ranks_dir)).values())


def check(out: str, world: int, source: str) -> list[dict[str, object]]:
    got = results(out)
    assert [r["rank"] for r in got] == list(range(world)), out
    expected_sum = float(sum(range(world)))
    for r in got:
        assert r["world"] == r["group_world"] == world
        assert r["sum"] == expected_sum
        assert r["source"] == source
        assert r["backend"] == "gloo" and r["device"] == "cpu"
        assert r["is_main"] == (r["rank"] == 0)
    assert out.count("MAIN_ONLY") == 1
    return got


@pytest.fixture
def worker(tmp_path: Path) -> Path:
    path = tmp_path / "worker.py"
    path.write_text(WORKER)
    return path


def test_popen_loop_with_torch_env_contract(worker: Path) -> None:
    port = str(free_port())
    procs = [
        subprocess.Popen(
            [PYTHON, str(worker)],
            env=base_env(
                RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r), LOCAL_WORLD_SIZE="2",
                MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
            ),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for r in range(2)
    ]
    with reaped(procs):
        outs = [p.communicate(timeout=180)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    got = check("".join(outs), 2, "torchrun")
    assert [r["local_rank"] for r in got] == [0, 1]


def _need(program: str) -> str:
    path = shutil.which(program)
    if path is None:
        missing(f"{program} not installed")
    return path


def test_mpirun_direct(worker: Path, tmp_path: Path) -> None:
    mpirun = _need("mpirun")
    done = subprocess.run(
        [mpirun, "-np", "2", *per_rank([PYTHON, str(worker)], tmp_path / "ranks")],
        env=base_env(**MPI_ROOT), capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    got = check(rank_text(tmp_path / "ranks"), 2, "openmpi")
    assert [(r["local_rank"], r["local_world"]) for r in got] == [(0, 2), (1, 2)]


def test_mpirun_through_torchhpc_exec(worker: Path, tmp_path: Path) -> None:
    """The per-task shim: exec exports the contract, the worker then sees torchrun-style variables."""
    mpirun = _need("mpirun")
    done = subprocess.run(
        [mpirun, "-np", "2", *per_rank([PYTHON, "-m", "torchhpc", "exec", "--", PYTHON, str(worker)], tmp_path / "ranks")],
        env=base_env(**MPI_ROOT), capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    check(rank_text(tmp_path / "ranks"), 2, "torchrun")


def test_real_torchrun(worker: Path) -> None:
    done = subprocess.run(
        [PYTHON, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
         "--master_addr", "127.0.0.1", "--master_port", str(free_port()), str(worker)],
        env=base_env(), capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    check(done.stdout, 2, "torchrun")


def test_torchhpc_run_local(worker: Path) -> None:
    done = subprocess.run(
        [PYTHON, "-m", "torchhpc", "run", "-n", "2", str(worker)],
        env=base_env(), capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    check(done.stdout, 2, "torchrun")


def test_torchhpc_run_explain_shows_torchrun_source(tmp_path: Path) -> None:
    script = tmp_path / "explain.py"
    script.write_text(
        "import subprocess, sys\n"
        "subprocess.run([sys.executable, '-m', 'torchhpc', 'env', '--explain', '--json'], check=True)\n"
    )
    done = subprocess.run(
        [PYTHON, "-m", "torchhpc", "run", "-n", "2", "--rank0-only", str(script)],
        env=base_env(), capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert '"name": "torchrun"' in done.stdout
    text = "".join(line.split(":", 1)[1] if line.startswith("[rank") else line for line in done.stdout.splitlines(True))
    verdicts = json.loads(text[text.index("[") :])
    chosen = [v for v in verdicts if v["chosen"]]
    assert [v["name"] for v in chosen] == ["torchrun"]
    assert chosen[0]["env"]["world_size"] == 2


@pytest.mark.cluster("slurm")
def test_slurm_srun_direct_mpirun_and_batch(slurm, worker: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """On two real nodes: srun-direct ranks, mpirun inside the allocation, and the batch script itself."""
    torchhpc = f"{PYTHON} -m torchhpc"
    out = tmp_path / "out"
    out.mkdir()
    job = tmp_path / "job.sh"
    job.write_text(
        "#!/bin/bash\n"
        f"export PYTHONPATH={REPO / 'src'} PYTHONUNBUFFERED=1\n"
        f"{torchhpc} env --json > {out}/batch.json\n"
        f"srun {PYTHON} {worker} > {out}/srun.txt 2>&1\n"
        + "".join(f"export {k}={v}\n" for k, v in MPI_ROOT.items())
        + f"mpirun -np 4 {join(per_rank([PYTHON, str(worker)], tmp_path / 'ranks'))} > {out}/mpirun.txt 2>&1\n"
    )
    job_id = slurm.sbatch(["-N2", "--ntasks-per-node=2", "-o", str(out / "job.log"), str(job)])
    info = slurm.wait(job_id, timeout=400)
    logs = {p.name: p.read_text() for p in out.iterdir()}
    assert info.get("JobState") == "COMPLETED", logs
    batch = json.loads(logs["batch.json"])
    assert (batch["source"], batch["world_size"], batch["scheduler"]) == ("local", 1, "slurm")
    srun = check(logs["srun.txt"], 4, "slurm")
    assert [(r["node_rank"], r["local_rank"]) for r in srun] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    mpi = check(rank_text(tmp_path / "ranks"), 4, "openmpi")
    assert [r["node_rank"] for r in mpi] == [0, 0, 1, 1]
