"""``torchhpc bench`` parsing, explain, report, gpu-on-CPU, and the sweep's job plan (rendered by the real slurm backend)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import PYTHON, need
from tests.unit.test_bench_report import make_result
from torchhpc.bench.sweep import plan
from torchhpc.cli.bench import config_from_args
from torchhpc.cli.main import build_parser, main
from torchhpc.core.spec import Entrypoint, JobSpec
from torchhpc.errors import UsageError


def parse(*argv: str) -> object:
    return build_parser().parse_args(["bench", *argv])


def test_nccl_tests_flags() -> None:
    args = parse("all_reduce", "-b", "1K", "-e", "64M", "-f", "4", "-n", "7", "-w", "2", "-c", "0", "-d", "bf16",
                 "-o", "max", "-a", "2", "-r", "1", "--min-bw", "5", "--json", "a.json", "-t", "broadcast")
    cfg = config_from_args(args)  # type: ignore[arg-type]
    assert cfg.collective_names() == ["all_reduce", "broadcast"]
    assert (cfg.minbytes, cfg.maxbytes, cfg.stepfactor) == (1024, 64 << 20, 4.0)
    assert (cfg.iters, cfg.warmup, cfg.check, cfg.dtype, cfg.op, cfg.average, cfg.root) == (7, 2, 0, "bfloat16", "max", 2, 1)
    assert (cfg.min_bw, cfg.json) == (5.0, "a.json")
    assert cfg.sizes() == [1024 * 4**k for k in range(9)]


def test_defaults_are_nccl_tests_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = config_from_args(parse("run"))  # type: ignore[arg-type]
    assert cfg.collective_names() == ["all_reduce"] and cfg.sizes() == [32 << 20]
    assert (cfg.iters, cfg.check, cfg.average, cfg.datatype, cfg.op) == (20, 1, 1, "float", "sum")
    monkeypatch.setenv("TORCHHPC_MIN_BW", "2.5")
    monkeypatch.setenv("TORCHHPC_MAXBYTES", "1G")
    cfg = config_from_args(parse("sendrecv"))  # type: ignore[arg-type]
    assert cfg.min_bw == 2.5 and cfg.maxbytes == 1 << 30


def test_bad_size_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        parse("all_reduce", "-b", "12Q")
    assert e.value.code == 2
    with pytest.raises(UsageError, match="-b/--minbytes 4096 is larger"):
        config_from_args(parse("all_reduce", "-b", "4K", "-e", "1K"))  # type: ignore[arg-type]


def test_explain(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "explain"]) == 0
    out = capsys.readouterr().out
    for needle in ("algbw", "busbw", "2(n-1)/n", "(n-1)/n", "#wrong", "Avg bus bandwidth = 0", "x 8"):
        assert needle in out, needle


def test_report_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    need("matplotlib")
    for n in (1, 2):
        make_result(n).save(tmp_path / f"bench-{n}n.json")
    assert main(["bench", "report", str(tmp_path), "-o", str(tmp_path / "r"), "-t", "all_reduce"]) == 0
    out = capsys.readouterr().out
    assert "| nodes | ranks |" in out and (tmp_path / "r" / "report.md").exists()
    assert (tmp_path / "r" / "busbw.png").stat().st_size > 1000
    assert main(["bench", "report", str(tmp_path / "nothing")]) == 2


def test_gpu_on_cpu_says_so_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    torch = need("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the CPU message does not apply")
    assert main(["bench", "gpu"]) == 0
    assert "No GPU on" in capsys.readouterr().out


def test_bench_parse_paths_load_no_torch() -> None:
    code = (
        "import sys\n"
        "import torchhpc.bench, torchhpc.bench.report, torchhpc.bench.sweep, torchhpc.bench.explain\n"
        "from torchhpc.cli.main import build_parser\n"
        "build_parser().parse_args(['bench', 'all_reduce', '-b', '1K'])\n"
        "from torchhpc.bench.explain import explain_text; explain_text()\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    r = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_sweep_plan_renders_one_slurm_job_per_node_count(tmp_path: Path) -> None:
    from torchhpc.schedulers import get_scheduler

    base = JobSpec(Entrypoint("module", "torchhpc.bench"), nproc_per_node=2, scheduler="slurm", launcher="srun",
                   name="bench", output_dir=str(tmp_path))
    jobs = plan(base, [1, 2, 3], "all_reduce", ["-b", "1K", "-e", "64K"], str(tmp_path / "out"))
    assert [j.nodes for j in jobs] == [1, 2, 3]
    assert jobs[1].json_path == str(tmp_path / "out" / "bench-2n.json")
    assert jobs[1].spec.entrypoint.argv("python") == [
        "python", "-m", "torchhpc.bench", "run", "-t", "all_reduce", "-b", "1K", "-e", "64K", "--json",
        jobs[1].json_path]
    script = get_scheduler("slurm").render(jobs[2].spec).script or ""
    assert "#SBATCH --nodes=3" in script and "bench-3n.json" in script and "torchhpc.bench" in script
    with pytest.raises(UsageError, match="--json"):
        plan(base, [1], "all_reduce", ["--json", "x"], str(tmp_path))


def test_sweep_rejects_bad_bench_flags_before_submitting(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "torchhpc", "bench", "sweep", "--scheduler", "slurm", "--nodes", "1,2",
         "--out", str(tmp_path), "--", "-b", "1K", "-e", "12Q"],
        capture_output=True, text=True, timeout=60,
    )
    assert r.returncode == 2 and "12Q" in r.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("name", "mem"),
    [("NVIDIA H100 80GB HBM3", 3350.0), ("NVIDIA H100 PCIe", 2000.0), ("NVIDIA GH200 480GB", 4000.0),
     ("NVIDIA H200", 4800.0), ("NVIDIA A100-SXM4-80GB", 2039.0), ("NVIDIA A100-SXM4-40GB", 1555.0),
     ("AMD Instinct MI250X", 1638.4)],
)
def test_known_peaks_pick_the_most_specific_device(name: str, mem: float) -> None:
    from torchhpc.bench.gpu import known_peak

    assert known_peak(name)["mem"] == mem
    assert known_peak("Some Future GPU") == {}
