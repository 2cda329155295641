"""Functions as jobs on the dev cluster: ``torchhpc.Executor(scheduler="slurm", ...)``, for real.

sbatch, srun, torchrun and mpirun start real ranks on two namespace nodes; each runs
``python -m torchhpc.functions.run`` which unpickles the function (cloudpickle), starts a gloo
process group and calls it; the values, failures and checkpoints come back through
the function directory. The containers are the ones the container tests use (podman
and Charliecloud, built by .ci/build-test-image.sh). Nothing is mocked.

The time-limit scenario reuses the nothing-lost machinery (tests/integration/test_nothing_lost.py):
the same 1-minute limit, 10 s warning and requeue, the same START/STOPPED/DONE lines and
the same zero-lost-steps check; the final parameters must equal an uninterrupted run's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

import torchhpc
from tests.conftest import REPO, container_image_env
from tests.integration.test_nothing_lost import STEPS, check_resumed_run, events, procs, report, steps_lost

pytestmark = pytest.mark.cluster("slurm")
LAUNCHERS = ("torchrun", "srun", "mpirun")


@pytest.fixture
def slurm_env(slurm_cluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """This process submits as a user's notebook would: the cluster's client environment in os.environ."""
    for k, v in slurm_cluster.client_env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.chdir(REPO)  # the ranks start here and import this module from here, as a user's would


# functions the ranks run -------------------------------------------------------------------------
def train(lr: float) -> tuple[float, int, str]:
    """All-reduces (rank + 1) * lr; returns the sum, this rank and its node."""
    import torch
    import torch.distributed as dist

    from torchhpc.functions.run import host

    total = torch.tensor([(dist.get_rank() + 1) * lr], dtype=torch.float64)
    dist.all_reduce(total)
    return total.item(), dist.get_rank(), host()


def train_inside(lr: float) -> tuple[float, int, str, str, str]:
    """train(), plus the interpreter that ran it (the image's, not the submitter's): its real path, as a
    venv over /usr/bin/python3 on the host's PATH (ch-run passes PATH; the checkout is bound) is the image's too."""
    import platform

    return (*train(lr), os.path.realpath(sys.executable), platform.python_version())


def fail_on_rank_3(lr: float) -> float:
    import torch.distributed as dist

    if dist.get_rank() == 3:
        raise ArithmeticError(f"rank 3 diverged at lr={lr}")
    dist.barrier()  # the others wait for rank 3, as a real training step would
    return lr


def cube(x: int) -> int:
    return x**3


def ckpt_train(steps: int, sleep: float, stop: torchhpc.Stop) -> list[list[float]]:
    """A small deterministic DDP run (tests/integration/scripts/ckpt_train.py, as a function).

    The checkpoint carries model, optimizer (momentum) and RNG state; data per step come
    from a generator seeded by (step, rank), noise from the global RNG, so losing any of
    them would change the final parameters. Rank 0 prints the nothing-lost event lines."""
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = dist.get_rank()

    def say(text: str) -> None:
        if rank == 0:
            print(f"{text} restart={stop.restarts} t={time.time():.3f}", flush=True)

    torch.manual_seed(1234 + rank)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
    with torch.no_grad():
        g = torch.Generator().manual_seed(0)
        for prm in model.parameters():
            prm.copy_(torch.randn(prm.shape, generator=g) * 0.1)
    ddp = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    start = 0
    if stop.state is not None:
        model.load_state_dict(stop.state["model"])
        opt.load_state_dict(stop.state["opt"])
        torch.set_rng_state(stop.state["rng"])
        start = stop.state["step"]
    say(f"START step={start} world={dist.get_world_size()}")
    for step in range(start, steps):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(8, 16, generator=g)
        y = x.sum(1, keepdim=True) + torch.randn(8, 1) * 0.01
        loss = ((ddp(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        done = step + 1
        if stop(step=done):
            say(f"STOPPED step={done}")
            return stop.checkpoint(  # type: ignore[return-value]
                {"model": model.state_dict(), "opt": opt.state_dict(), "rng": torch.get_rng_state(), "step": done}
            )
        say(f"step {done}")
        if stop.restarts == 0:
            time.sleep(sleep)
    say(f"DONE step={steps}")
    return [p.detach().flatten().tolist() for p in model.parameters()]


# 1. the acceptance call under each launcher ---------------------------------------------------------
def test_two_nodes_two_ranks_each_launcher_rank0_value_and_every_rank_in_order(slurm_env: None, tmp_path: Path) -> None:
    """``Executor(scheduler="slurm", nodes=2, nproc_per_node=2, launcher=L).submit(train, lr=0.1)``, the three
    launchers side by side: result() is rank 0's all-reduced value, results() the 4 ranks' in rank order."""
    jobs = {
        L: torchhpc.Executor(scheduler="slurm", nodes=2, nproc_per_node=2, launcher=L, output_dir=str(tmp_path / L))
        .submit(train, lr=0.1)
        for L in LAUNCHERS
    }
    for L, job in jobs.items():
        total, rank, _ = job.result(timeout=300)
        assert (round(total, 12), rank) == (1.0, 0), L  # 0.1 * (1 + 2 + 3 + 4)
        values = job.results()
        assert [v[1] for v in values] == [0, 1, 2, 3], L
        assert all(round(v[0], 12) == 1.0 for v in values), L
        assert len({v[2] for v in values}) == 2, f"{L}: {values}"  # two nodes


def test_local_scheduler_same_call(tmp_path: Path, clean_user_env: None) -> None:
    job = torchhpc.Executor(scheduler="local", nproc_per_node=4, output_dir=str(tmp_path)).submit(train, lr=0.1)
    assert [(round(v[0], 12), v[1]) for v in job.results(timeout=180)] == [(1.0, r) for r in range(4)]


# 2. a rank raises -----------------------------------------------------------------------------------
def _end_time(job: torchhpc.FunctionJob) -> float:
    return datetime.fromisoformat(job.status().raw["EndTime"]).timestamp()


def test_rank_3_raising_comes_back_within_seconds_naming_rank_node_and_last_line(slurm_env: None, tmp_path: Path) -> None:
    """Under each launcher: JobFailed names rank 3, its node and the traceback's last line, a few
    seconds after the job's end (Slurm's EndTime); no process of the job is left on any node."""
    jobs = {
        L: torchhpc.Executor(scheduler="slurm", nodes=2, nproc_per_node=2, launcher=L, output_dir=str(tmp_path / L))
        .submit(fail_on_rank_3, 0.5)
        for L in LAUNCHERS
    }
    for L, job in jobs.items():
        with pytest.raises(torchhpc.JobFailed) as info:
            job.result(timeout=300)
        raised = time.time()
        e = info.value
        nodes = subprocess.run(["scontrol", "show", "hostnames", job.status().raw["NodeList"]],
                               capture_output=True, text=True).stdout.split()
        assert e.rank == 3 and e.host in nodes, f"{L}: {e.rank} {e.host} {nodes}"
        assert "ArithmeticError: rank 3 diverged at lr=0.5" in str(e) and "rank 3 on " + str(e.host) in str(e), L
        assert (e.remote_traceback or "").strip().splitlines()[-1] == "ArithmeticError: rank 3 diverged at lr=0.5"
        lag = raised - _end_time(job)
        assert lag < 15, f"{L}: raised {lag:.1f} s after the job's end"
        assert not procs(str(job.function_dir.path)), f"{L}: processes left: {procs(str(job.function_dir.path))}"
        report(f"function-raises ({L})", job_end_to_raised_s=lag, rank=e.rank, host=e.host)


# 3. arrays ------------------------------------------------------------------------------------------
def test_map_array_four_items_parallelism_two_one_array_job(slurm_env: None, tmp_path: Path, slurm: Any) -> None:
    items = [2, 3, 5, 7]
    jobs = torchhpc.Executor(scheduler="slurm", output_dir=str(tmp_path)).map_array(cube, items, parallelism=2)
    assert len({j.handle.job_id for j in jobs}) == 1
    assert [str(j) for j in jobs] == [f"slurm:{jobs[0].handle.job_id}_{i}" for i in range(4)]
    assert [j.result(timeout=300) for j in jobs] == [cube(x) for x in items]
    info = slurm.job(f"{jobs[0].handle.job_id}_0")
    assert info.get("ArrayTaskThrottle") == "2", info


# 4. time limit: checkpoint, requeue, resume ------------------------------------------------------------
# Four 2-node jobs at once, three of them racing a warning Slurm may send up to a minute early. Beside
# four other rank-starting tests (load 20-30 on 2 cores, runs Y and Z in docs/testing.md) torchrun's ranks
# checkpointed 1 s after the warning, and its agents then took 29 s to leave (Y: 8 s), past the limit:
# TIMEOUT, no requeue. The same race as test_nothing_lost's time-limit test, held the same way.
@pytest.mark.whole_machine
def test_time_limit_checkpointable_function_loses_nothing_and_matches_an_uninterrupted_run(
    slurm_env: None, tmp_path: Path
) -> None:
    """A function taking torchhpc.Stop, 2 nodes x 1 rank, --time 2 --signal-before 10 (requeue is implied),
    under each launcher side by side: it returns a checkpoint at the warning, the job requeues, the
    next attempt resumes at that step; 0 steps lost or repeated; the final parameters equal an
    uninterrupted run's exactly. Slurm's warning may come up to 60 s early (its timer's resolution):
    with a 1-minute limit it came ~10 s into every attempt, before torchrun's ranks had started, so the
    limit is 2 minutes and the first attempt's 60 steps take 120 s (the next attempts do not sleep, and
    finish before the earliest warning). A warning as the function returns still requeues a finished
    job; that attempt must not call the function again (no START after DONE)."""
    common = {"scheduler": "slurm", "nodes": 2, "nproc_per_node": 1}
    ref = torchhpc.Executor(**common, output_dir=str(tmp_path / "ref")).submit(ckpt_train, STEPS, 0.0)
    jobs = {
        L: torchhpc.Executor(**common, launcher=L, time="2", signal_before=10, max_timeout_requeues=5,
                             output_dir=str(tmp_path / L)).submit(ckpt_train, STEPS, 2.0)
        for L in LAUNCHERS
    }
    reference = ref.result(timeout=300)
    for L, job in jobs.items():
        final = job.result(timeout=900)
        st = job.status()
        text = _every_attempt(st.log_dir)
        assert st.state == "COMPLETED" and st.restarts >= 1, f"{L}: {st}\n{text}"
        lost, repeated, to_resume = check_resumed_run(text)
        assert (lost, repeated) == (0, 0) and steps_lost(text) == (0, 0), L
        assert final == reference, f"{L}: the resumed run's parameters differ from the uninterrupted run's"
        done = max(e[3] for e in events(text) if e[0] == "DONE")
        assert not [e for e in events(text) if e[0] == "START" and e[3] > done], f"{L}: ran again after DONE:\n{text}"
        report(f"function time-limit ({L})", restarts=st.restarts, steps_lost=lost, steps_repeated=repeated,
               stopped_to_resumed_s=to_resume)


def _every_attempt(job_dir: str) -> str:
    """The batch shell's output and every rank file of every attempt (a requeued attempt may run on other
    nodes, so a rank's lines can be in several files; the events carry their own times)."""
    d = Path(job_dir)
    paths = [d / "slurm.out", *sorted((d / "ranks").glob("*.log"))]
    return "".join(p.read_text(errors="replace") for p in paths if p.exists())


# 5. containers ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def images() -> dict[str, str]:
    """The container tests' images (built or reused by .ci/build-test-image.sh), as env variables."""
    return container_image_env()


@pytest.fixture
def by_value() -> Iterator[None]:
    """Pickle this module's functions by value: the image has no pytest to import this module with,
    as a user's notebook functions travel by value. torchhpc comes from the bound checkout (PYTHONPATH)."""
    import cloudpickle

    module = sys.modules[__name__]
    cloudpickle.register_pickle_by_value(module)
    yield
    cloudpickle.unregister_pickle_by_value(module)


SOURCE = {"PYTHONPATH": str(REPO / "src")}  # torchhpc inside the image: the checkout, bound at the same path


@pytest.fixture
def in_checkout(tmp_path: Path) -> Iterator[Path]:
    """An output directory under the working directory, which every runtime binds at the same path
    (Charliecloud binds only onto directories that exist in the image: the checkout's path does)."""
    d = REPO / "out" / f"functions-{tmp_path.name}"
    d.mkdir(parents=True)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("runtime", ["podman", "charliecloud"])
def test_two_nodes_in_containers(slurm_env: None, images: dict[str, str], runtime: str, in_checkout: Path,
                                 by_value: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each rank runs the function inside the image (its Python is Debian's 3.11.2: the submitter's
    3.11 minor, so the pickle is accepted)."""
    for k, v in images.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("USER", os.environ.get("USER", "root"))
    image = images["TORCHHPC_TEST_PODMAN_IMAGE" if runtime == "podman" else "TORCHHPC_TEST_CH_IMAGE"]
    ex = torchhpc.Executor(scheduler="slurm", nodes=2, nproc_per_node=2, launcher="srun", runtime=runtime,
                           container=image, output_dir=str(in_checkout), env=SOURCE)
    values = ex.submit(train_inside, lr=0.1).results(timeout=300)
    assert [(round(v[0], 12), v[1]) for v in values] == [(1.0, r) for r in range(4)]
    assert len({v[2] for v in values}) == 2
    assert {v[4] for v in values} == {_image_python(images)} and {v[3][:16] for v in values} == {"/usr/bin/python3"}, values


def test_local_scheduler_in_podman(images: dict[str, str], in_checkout: Path, clean_user_env: None,
                                   by_value: None, monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in images.items():
        monkeypatch.setenv(k, v)
    ex = torchhpc.Executor(scheduler="local", nproc_per_node=2, runtime="podman",
                           container=images["TORCHHPC_TEST_PODMAN_IMAGE"], output_dir=str(in_checkout), env=SOURCE)
    values = ex.submit(train_inside, lr=0.1).results(timeout=300)
    assert [(round(v[0], 12), v[1]) for v in values] == [(0.3, 0), (0.3, 1)]
    assert {v[4] for v in values} == {_image_python(images)} and {v[3][:16] for v in values} == {"/usr/bin/python3"}, values


def _image_python(images: dict[str, str]) -> str:
    exe = Path(images["TORCHHPC_TEST_CH_IMAGE"]) / "usr" / "bin" / "python3"
    return subprocess.run([str(exe), "-c", "import platform; print(platform.python_version())"],
                          capture_output=True, text=True).stdout.strip()
