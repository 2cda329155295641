"""Nothing ignored in silence (issue 26 item 3, issue 25 item 3): one test per flag of docs/capabilities.md.

Every flag a scheduler cannot honour is refused (exit 2, a HINT) or converted (the dry run's
``# note:`` says how, and the render carries the converted value), never dropped. The CLI
goes through ``main()`` with ``--dry-run`` (render only: nothing is submitted), the Python
API through :class:`torchhpc.job.Job`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import REPO
from torchhpc.cli.main import main
from torchhpc.core.spec import Entrypoint, JobSpec
from torchhpc.errors import SpecError
from torchhpc.job import Job, no_gpu_warning
from torchhpc.schedulers import REGISTRY, capabilities_table, get_scheduler, scheduler_class
from torchhpc.schedulers.capabilities import CAPABILITIES, RULES

pytestmark = pytest.mark.usefixtures("clean_user_env")


def dry(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["run", *args, "--dry-run", "examples/pi.py"])
    out = capsys.readouterr()
    return code, out.out, out.err


def refused(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    code, out, err = dry(capsys, *args)
    assert code == 2, (args, out, err)
    assert "HINT:" in err, err
    return err


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--scheduler", "local", "--nodes", "2"], "--nodes=2: the local scheduler"),
        (["--scheduler", "local", "--time", "00:10:00"], "--time 00:10:00: the local scheduler has no wall-time"),
        (["--scheduler", "runai", "--image", "img", "--time", "00:10:00"], "the runai scheduler has no wall-time"),
        (["--scheduler", "local", "--signal-before", "60"], "--signal-before 60: the local scheduler"),
        (["--scheduler", "local", "--requeue"], "--requeue: the local scheduler cannot requeue"),
        (["--scheduler", "kubernetes", "--image", "img", "--requeue"], "--requeue: the kubernetes scheduler"),
        (["--scheduler", "runai", "--image", "img", "--requeue"], "--requeue: the runai scheduler"),
        (["--scheduler", "kubernetes", "--image", "img", "--array", "0-3"], "--array 0-3: the kubernetes scheduler"),
        (["--scheduler", "runai", "--image", "img", "--array", "0-3"], "--array 0-3: the runai scheduler"),
        (["--scheduler", "local", "--mem", "4G"], "--mem 4G: the local scheduler cannot"),
        (["--scheduler", "kubernetes", "--container", "img", "--bind", "/a:/b"], "which no pod can mount"),
        (["--scheduler", "runai", "--container", "img", "--container-env", "A=1"], "the runai scheduler runs pods"),
        (["--scheduler", "slurm", "--rank0-only"], "--rank0-only: the slurm scheduler"),
        (["--scheduler", "kubernetes", "--image", "img", "--after-ok", "7"], "--after-ok 7: the kubernetes scheduler"),
        (["--scheduler", "runai", "--image", "img", "--after-any", "7"], "--after-any 7: the runai scheduler"),
        (["--scheduler", "pbs", "--nodes", "3", "--min-nodes", "2", "--max-restarts", "1"],
         "--min-nodes 2: PBS gives the supervisor no per-node liveness"),
        (["--scheduler", "kubernetes", "--image", "img", "--nodes", "3", "--min-nodes", "2", "--max-restarts", "1"],
         "--min-nodes 2: a TrainJob has no elastic fields"),
        (["--scheduler", "slurm", "--nodes", "3", "--min-nodes", "2"], "--min-nodes=2: going on with fewer nodes"),
        (["--scheduler", "slurm", "--nodes", "3", "--min-nodes", "4", "--max-restarts", "1"],
         "--min-nodes=4 must be between 1 and --nodes (3)"),
    ],
)
def test_unsupported_flag_is_refused(capsys: pytest.CaptureFixture[str], args: list[str], needle: str) -> None:
    assert needle in refused(capsys, *args)


def test_cpus_per_proc_on_local_becomes_omp_threads(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = dry(capsys, "--scheduler", "local", "-n", "2", "--cpus-per-proc", "3")
    assert code == 0
    assert "export OMP_NUM_THREADS=3" in out
    assert "# note: --cpus-per-proc 3: the local scheduler reserves no CPUs; each rank gets OMP_NUM_THREADS=3" in out


def test_cpus_per_proc_on_local_keeps_the_users_omp(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = dry(capsys, "--scheduler", "local", "--cpus-per-proc", "3", "--env", "OMP_NUM_THREADS=5")
    assert code == 0 and "export OMP_NUM_THREADS=5" in out and "OMP_NUM_THREADS=5 from --env stays" in out


def test_cpus_per_gpu_on_pods_becomes_a_cpu_limit(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = dry(capsys, "--scheduler", "kubernetes", "--image", "img", "--gpus-per-node", "4",
                       "--nproc-per-node", "4", "--cpus-per-gpu", "8")
    assert code == 0
    assert "cpu: 32" in out  # 8 CPUs per GPU x 1 GPU per process x 4 processes in the pod
    assert "--cpus-per-gpu 8: the kubernetes scheduler takes CPUs per process: --cpus-per-proc 8" in out


def test_cpus_per_gpu_on_runai_becomes_cpu_flag(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = dry(capsys, "--scheduler", "runai", "--image", "img", "--gpus-per-node", "2",
                       "--nproc-per-node", "2", "--cpus-per-gpu", "6")
    assert code == 0 and "--cpu-core-request 12" in out and "--cpus-per-proc 6" in out  # the current CLI
    code, out, _ = dry(capsys, "--scheduler", "runai", "--image", "img", "--gpus-per-node", "2",
                       "--nproc-per-node", "2", "--cpus-per-gpu", "6", "--opt", "cli=v1")
    assert code == 0 and "--cpu 12" in out  # runai submit-dist


def test_setup_lines_refused_on_pods() -> None:
    """RunAI and Kubeflow's PyTorchJob have nowhere to run them; a TrainJob runs them in the pod (test_trainjob)."""
    for scheduler, opts in (("runai", (("image", "img"),)), ("kubernetes", (("image", "img"), ("api", "pytorchjob")))):
        spec = JobSpec(Entrypoint.parse(["train.py"]), scheduler=scheduler, setup=("module load x",), options=opts)
        with pytest.raises(SpecError) as e:
            get_scheduler(scheduler).render(spec)
        assert "setup lines" in e.value.message and e.value.hint


def test_gpus_everywhere_and_local_warns_once_without_any() -> None:
    # No scheduler lacks GPUs; a local run on a machine without one runs after one warning line.
    assert all(scheduler_class(n).supports_gpus for n in REGISTRY)
    spec = JobSpec(Entrypoint.parse(["t.py"]), gpus_per_node=2, nproc_per_node=2, scheduler="local")
    warning = no_gpu_warning(spec)
    from torchhpc.job import visible_gpus

    if visible_gpus("nvidia"):
        assert warning is None
    else:
        assert warning is not None and "\n" not in warning and "the ranks run on CPU" in warning


def test_python_api_applies_the_same_check() -> None:
    with pytest.raises(SpecError, match="the local scheduler has no wall-time limit"):
        Job(["examples/pi.py"], scheduler="local", time="00:05:00").render()
    sub = Job(["examples/pi.py"], scheduler="local", cpus_per_task=2).render()
    assert any("OMP_NUM_THREADS=2" in n for n in sub.notes)


def test_config_time_is_not_applied_to_local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text('time = "01:00:00"\n')
    monkeypatch.setenv("TORCHHPC_CONFIG", str(cfg))
    code, out, _ = dry(capsys, "--scheduler", "local")
    assert code == 0
    code, out, _ = dry(capsys, "--scheduler", "slurm")
    assert code == 0 and "--time=01:00:00" in out
    monkeypatch.setenv("TORCHHPC_TIME", "00:30:00")  # a request, not a default
    refused(capsys, "--scheduler", "local")


def test_every_rule_names_a_declared_capability() -> None:
    for rule in RULES:
        assert rule.capability in CAPABILITIES
        assert (rule.refuse is None) != (rule.convert is None)
    for attr in CAPABILITIES:
        for name in REGISTRY:
            assert isinstance(getattr(scheduler_class(name), attr), bool)


def test_check_is_idempotent() -> None:
    sched = get_scheduler("local")
    spec = JobSpec(Entrypoint.parse(["t.py"]), cpus_per_task=4)
    once, notes = sched.supported(spec)
    twice, again = sched.supported(once)
    assert notes and not again and once == twice


def test_docs_table_is_the_code() -> None:
    text = (REPO / "docs" / "capabilities.md").read_text()
    body = text.split("<!-- generated: capabilities -->\n", 1)[1].split("<!-- end generated -->", 1)[0]
    assert body == capabilities_table(), (
        "regenerate with: python -c 'from torchhpc.schedulers import capabilities_table; print(capabilities_table())'"
    )


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["run", "--array", "0-3", "--dry-run", "examples/pi.py", "--out", "x{idx}"], "{idx} is not a placeholder"),
        (["sweep", "--grid", "lr=1,2", "--dry-run", "examples/pi.py", "{learning_rate}"], "{learning_rate}"),
    ],
)
def test_placeholder_typos_are_refused(capsys: pytest.CaptureFixture[str], argv: list[str], needle: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and "{index}" in err, err
    if argv[0] == "sweep":
        assert "{lr}" in err and "--grid learning_rate=" in err


def test_defined_placeholders_pass(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--array", "0-1", "--dry-run", "examples/pi.py", "{index}"]) == 0
    with pytest.raises(SpecError, match=r"\{lr\} is not a placeholder"):
        JobSpec(Entrypoint.parse(["t.py", "--lr={lr}"]), array="0-1")
