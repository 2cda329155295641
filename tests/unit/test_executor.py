"""Functions as jobs on this machine: ``torchhpc.Executor(scheduler="local", ...)``, for real.

Every job here runs real ranks (the local scheduler's processes, a real gloo process
group, cloudpickle both ways); nothing is mocked. The Kubernetes and PBS cases only
render (no API server, no PBS server here), as the program path's tests do.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import torchhpc
from tests.conftest import REPO, need
from torchhpc.errors import SpecError

pytestmark = pytest.mark.usefixtures("clean_user_env")


# functions the ranks run (importable from the repository, as a user's module is from their directory)
def allreduce_rank_plus_one(x: float) -> float:
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    return x * total.item() + rank / 10


def raise_on_rank_1(x: float) -> float:
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise ValueError(f"rank 1 refuses x={x}")
    return x


def square_plus_world(x: int) -> tuple[int, int]:
    import torch.distributed as dist

    return x * x + 1, dist.get_world_size()


def ex_local(tmp_path: Path, **kw: Any) -> torchhpc.Executor:
    return torchhpc.Executor(scheduler="local", output_dir=str(tmp_path / "out"), **kw)


# --- acceptance: local ------------------------------------------------------------------------------
def test_local_two_ranks_result_is_rank0_and_results_in_rank_order(tmp_path: Path) -> None:
    job = ex_local(tmp_path, nproc_per_node=2).submit(allreduce_rank_plus_one, 2.0)
    assert job.result(timeout=120) == 6.0
    assert job.results() == [6.0, 6.1]
    assert job.done() and job.status().state == "COMPLETED"
    assert (job.function_dir.path / "fn.pkl").is_file()  # the pickle lives in the job's function directory


def test_local_rank_1_raising_is_jobfailed_with_rank_host_and_traceback(tmp_path: Path) -> None:
    job = ex_local(tmp_path, nproc_per_node=2).submit(raise_on_rank_1, 3.0)
    t0 = time.monotonic()
    with pytest.raises(torchhpc.JobFailed) as info:
        job.result(timeout=120)
    e = info.value
    assert e.rank == 1
    assert e.host
    assert e.remote_traceback and "raise_on_rank_1" in e.remote_traceback
    assert e.remote_traceback.strip().splitlines()[-1] == "ValueError: rank 1 refuses x=3.0"
    assert "rank 1" in str(e) and "ValueError: rank 1 refuses x=3.0" in str(e)
    assert "_fnrun" not in e.remote_traceback  # the user's frames, not the runner's
    assert time.monotonic() - t0 < 60
    assert job.status().state == "FAILED"
    assert "ValueError: rank 1 refuses" in job.logs()


def test_a_script_functions_traceback_names_its_file(tmp_path: Path) -> None:
    """A function of a script's __main__ goes by value; cloudpickle names its file "<dynamic-code>".
    The remote traceback names the script, line and function instead (issue 51, item 6)."""
    import subprocess
    import sys

    script = tmp_path / "job.py"
    script.write_text(
        "import torchhpc\n"
        "def boom(x):\n"
        "    raise ValueError(f'bad {x}')\n"
        "if __name__ == '__main__':\n"
        "    job = torchhpc.Executor(scheduler='local', nproc_per_node=1).submit(boom, 3)\n"
        "    try:\n"
        "        job.result(timeout=120)\n"
        "    except torchhpc.JobFailed as e:\n"
        "        print(e.remote_traceback)\n"
    )
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert f'File "{script}", line 3, in boom' in done.stdout, done.stdout + done.stderr
    assert "<dynamic-code>" not in done.stdout


def test_function_keywords_never_meet_job_keywords(tmp_path: Path) -> None:
    """``nodes`` given to submit() is the function's own keyword, not the job's."""

    job = ex_local(tmp_path, nproc_per_node=1).submit(dict, nodes=7, name="x")
    assert job.result(timeout=120) == {"nodes": 7, "name": "x"}
    with pytest.raises(TypeError, match="unexpected keyword"):
        torchhpc.Executor(scheduler="local", lr=0.1)


def test_map_array_four_items_two_at_a_time_match_local_calls(tmp_path: Path) -> None:
    items = [1, 2, 3, 4]
    jobs = ex_local(tmp_path).map_array(square_plus_world, items, parallelism=2)
    assert len(jobs) == 4 and len({j.handle.job_id for j in jobs}) == 1  # one array job
    assert [j.result(timeout=180) for j in jobs] == [(x * x + 1, 1) for x in items]
    assert [j.task for j in jobs] == [0, 1, 2, 3]
    rendered = str(ex_local(tmp_path).render(square_plus_world, 1))
    assert "torchhpc.functions.run" in rendered and "function pickle:" in rendered


# --- safety ------------------------------------------------------------------------------------------
def test_closure_over_a_lock_refused_at_submit_naming_it(tmp_path: Path) -> None:
    guard = threading.Lock()

    def train(lr: float) -> float:
        with guard:
            return lr

    out = tmp_path / "out"
    with pytest.raises(SpecError) as info:
        ex_local(tmp_path).submit(train, 0.1)
    text = str(info.value)
    assert "train.guard" in text and "lock" in text and "HINT:" in text
    assert not out.exists() or not any(out.iterdir()), "nothing may be written or submitted"


def test_open_file_in_an_argument_refused_naming_it(tmp_path: Path) -> None:
    with open(tmp_path / "f.txt", "w") as f, pytest.raises(SpecError, match=r"keyword log\b.*TextIOWrapper"):
        ex_local(tmp_path).submit(print, log=f)


def test_tensor_off_the_cpu_refused_naming_it(tmp_path: Path) -> None:
    """A CUDA tensor cannot be made here (no GPU); a tensor on the meta device takes the same path:
    any tensor not on the CPU is refused before pickling, named, with the .cpu() hint."""
    torch = need("torch")
    weights = {"w": torch.zeros(3, device="meta")}

    def fn() -> int:
        return len(weights)

    with pytest.raises(SpecError) as info:
        ex_local(tmp_path).submit(fn)
    assert "fn.weights['w']" in str(info.value) and "a tensor on meta" in str(info.value) and ".cpu()" in str(info.value)


@pytest.mark.parametrize("field,value", [("python", "3.6.15"), ("cloudpickle", "0.5.0")])
def test_version_mismatch_refused_on_the_rank_with_a_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, field: str, value: str
) -> None:
    """The recorded version is edited (as if another interpreter had submitted): the rank refuses
    before unpickling, says why with a HINT, and the submitter gets it as JobFailed."""
    import torchhpc.functions.executor as ex_mod
    from torchhpc.functions.pack import submit_versions

    monkeypatch.setattr(ex_mod, "submit_versions", lambda: {**submit_versions(), field: value})
    job = ex_local(tmp_path, nproc_per_node=2).submit(allreduce_rank_plus_one, 1.0)
    with pytest.raises(torchhpc.JobFailed) as info:
        job.result(timeout=120)
    assert f"pickled by Python {value}" in str(info.value) or f"pickled with cloudpickle {value}" in str(info.value)
    assert "HINT:" in (info.value.remote_traceback or "")
    log = job.logs()
    assert "refuses the function" in log and "HINT:" in log
    assert json.loads((job.function_dir.path / "meta.json").read_text())["versions"][field] == value


def test_version_rules() -> None:
    from torchhpc.functions.pack import version_mismatch

    base = {"python": "3.11.7", "cloudpickle": "3.1.3", "torch": "2.13.0"}
    assert version_mismatch(base, {**base, "python": "3.11.2"}) is None  # micro releases share bytecode
    assert version_mismatch(base, {**base, "torch": "2.13.0+cpu"}) is None
    assert "Python 3.12.0" in (version_mismatch(base, {**base, "python": "3.12.0"}) or "")
    assert "torch 2.12.0" in (version_mismatch(base, {**base, "torch": "2.12.0"}) or "")
    assert version_mismatch({**base, "torch": None}, {**base, "torch": None}) is None  # submitter had no torch


def test_missing_cloudpickle_is_one_clear_error(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['cloudpickle'] = None\n"
        "import torchhpc\n"
        "try:\n"
        f"    torchhpc.Executor(scheduler='local', output_dir={str(tmp_path)!r}).submit(print, 1)\n"
        "except torchhpc.TorchHPCError as e:\n"
        "    print('ERR', e)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert "ERR cloudpickle is not installed" in r.stdout and "pip install 'cloudpickle==" in r.stdout, r.stdout + r.stderr


def test_import_torchhpc_and_its_executor_stay_torch_free() -> None:
    code = (
        "import sys, torchhpc\n"
        "torchhpc.Executor, torchhpc.FunctionJob, torchhpc.JobFailed, torchhpc.Stop\n"
        "torchhpc.Executor(scheduler='slurm', nodes=2).render(print, 1)\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr
    assert {"Executor", "FunctionJob", "JobFailed"} <= set(torchhpc.__all__)


# --- renders: Slurm, PBS, Kubernetes -------------------------------------------------------------------
def test_slurm_and_pbs_renders_run_the_runner_and_arrays_use_their_syntax(tmp_path: Path) -> None:
    slurm = torchhpc.Executor(scheduler="slurm", nodes=2, nproc_per_node=2, launcher="srun", output_dir=str(tmp_path))
    text = str(slurm.render(allreduce_rank_plus_one, 1.0))
    assert "-m torchhpc.functions.run" in text and str(tmp_path) in text
    pbs = torchhpc.Executor(scheduler="pbs", nodes=2, nproc_per_node=2, launcher="mpirun", output_dir=str(tmp_path))
    assert "torchhpc.functions.run" in str(pbs.render(allreduce_rank_plus_one, 1.0))
    spec, _, _ = pbs._prepare(square_plus_world, (), {}, [1, 2, 3, 4], 2)
    from torchhpc.job import Job

    assert "#PBS -J 0-3%2" in str(Job(spec).render())
    spec, _, _ = slurm._prepare(square_plus_world, (), {}, [1, 2, 3, 4], 2)
    assert "#SBATCH --array=0-3%2" in str(Job(spec).render())


def test_kubernetes_render_names_the_pvc_or_refuses(tmp_path: Path) -> None:
    common = {"scheduler": "kubernetes", "nodes": 2, "image": "pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime"}
    with pytest.raises(SpecError, match="pods cannot see") as info:
        torchhpc.Executor(**common, output_dir=str(tmp_path)).render(print, 1)
    assert "pvc" in str(info.value)
    ok = torchhpc.Executor(**common, output_dir="/mnt/shared/runs", options={"pvc": "team-data:/mnt/shared"})
    text = str(ok.render(print, 1))
    assert "function pickle: /mnt/shared/runs/print-fn-" in text and "on PVC team-data mounted at /mnt/shared" in text
    runai = torchhpc.Executor(scheduler="runai", nodes=2, image=common["image"], output_dir="/mnt/s/runs",
                              options={"pvc": "scratch:/mnt/s"})
    assert "on PVC scratch mounted at /mnt/s" in str(runai.render(print, 1))
    assert "claimName: team-data" in text and "/mnt/shared/runs/print-fn-" in text and "run.py" in text


# --- checkpointable functions --------------------------------------------------------------------------
def test_stop_parameter_is_found_by_annotation_or_mark() -> None:
    from torchhpc.functions.requeue import Stop, stop_parameter

    def annotated(lr: float, stop: torchhpc.Stop) -> float:
        return lr

    def as_text(lr: float, halt: Stop) -> float:  # a string under `from __future__ import annotations`
        return lr

    annotated.__annotations__["stop"] = torchhpc.Stop  # as without the __future__ import: the class itself

    @torchhpc.checkpointable("s")
    def marked(lr: float, s: Any) -> float:
        return lr

    assert stop_parameter(annotated) == "stop"
    assert stop_parameter(as_text) == "halt"
    assert stop_parameter(marked) == "s"
    assert stop_parameter(allreduce_rank_plus_one) is None


def counting(n: int, stop: torchhpc.Stop) -> tuple[int, int, bool]:
    """Counts to n; asks to stop once at 3 (as a time-limit warning would) and resumes from its checkpoint."""
    state = stop.state or {"i": 0, "stopped_at": None}
    for i in range(state["i"], n):
        if i == 3 and not stop.resumed:
            open(os.environ["TORCHHPC_STOP_FILE"], "a").close()
        if stop(step=i):
            return stop.checkpoint({"i": i, "stopped_at": i})  # type: ignore[return-value]
    return n, state["stopped_at"], stop.resumed


def test_checkpoint_is_kept_per_rank_and_the_next_call_resumes_from_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner itself, twice, as a requeued job calls it: the first attempt returns a checkpoint
    (kept in the function directory), the second starts from it and returns the value."""
    monkeypatch.setenv("TORCHHPC_STOP_FILE", str(tmp_path / "stop"))
    ex = ex_local(tmp_path)
    _, fdir, stop_param = ex._prepare(counting, (6,), {}, None, None)
    from torchhpc.functions.pack import dumps, submit_versions

    fdir.write(dumps({"fn": counting, "args": (6,), "kwargs": {}, "items": None, "stop_param": stop_param}),
               {"versions": submit_versions()})
    run = [sys.executable, "-m", "torchhpc.functions.run", str(fdir.path)]
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}"}
    first = subprocess.run(run, capture_output=True, text=True, env=env, timeout=120)
    assert first.returncode == 0, first.stderr
    assert fdir.state_path(0).exists() and not fdir.result_path(0).exists()
    os.unlink(tmp_path / "stop")  # the batch script clears it for the next attempt
    second = subprocess.run(run, capture_output=True, text=True, env=env, timeout=120)
    assert second.returncode == 0, second.stderr
    import cloudpickle

    record = fdir.records()[0]
    assert cloudpickle.loads(record["value"]) == (6, 3, True)
    # A third attempt (the warning came as the function returned, so the job was requeued once more)
    # must not run the function again: every rank's value is recorded.
    fdir.meta_path.write_text(json.dumps({**fdir.meta(), "world_size": 1}))
    third = subprocess.run(run, capture_output=True, text=True, env=env, timeout=120)
    assert third.returncode == 0 and "already returned on every rank" in third.stderr, third.stderr
    assert fdir.records()[0]["time"] == record["time"]


@pytest.mark.slow
def test_docs_notebook_example_runs_and_prints_the_table(tmp_path: Path) -> None:
    """docs/functions.md's notebook cell, with the local scheduler instead of Slurm (the only change)."""
    import re

    text = (REPO / "docs" / "functions.md").read_text()
    cell = next(b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "map_array(train, lrs" in b)
    slurm = 'scheduler="slurm", nodes=1, nproc_per_node=2, time="00:10:00"'
    assert slurm in cell
    (tmp_path / "cell.py").write_text(cell.replace(slurm, 'scheduler="local", nproc_per_node=2'))
    r = subprocess.run([sys.executable, "cell.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = re.findall(r"^\| (0\.\d+) \| (\d+\.\d{4}) \|$", r.stdout, re.M)
    assert [lr for lr, _ in rows] == ["0.001", "0.01", "0.03", "0.1"], r.stdout
    assert float(rows[0][1]) > float(rows[-1][1])  # the larger rate trains further in 200 steps
