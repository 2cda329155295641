"""``torchhpc top``'s pure parts: progress from real rank output, py-spy's raw samples, the straggler
rule, the table, and the CLI's refusals.

The progress logs in tests/data/progress/ are real output (tests/data/progress/record.py made them:
a tqdm loop, a tiny Hugging Face Trainer run, a tiny Lightning run with its Rich bar and with its
tqdm bar). tests/data/py_spy_record_raw.txt is a real ``py-spy record --format raw --idle`` of one
rank of tests/integration/scripts/straggler.py (a waiting rank, with tqdm's monitor thread).
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from torchhpc.dist.progress import mark_step
from torchhpc.observe.progress import parse_progress
from torchhpc.observe.sample import RankSample, gpu_by_pid, parse_raw, rocm_cards
from torchhpc.observe.top import FOLD_AT, RankRow, gather, stragglers, table

DATA = REPO / "tests" / "data"


def _log(name: str) -> str:
    return (DATA / "progress" / f"{name}.log").read_text()


def test_tqdm_bar_gives_n_total_and_rate() -> None:
    p = parse_progress(_log("tqdm"))
    assert p is not None and p["kind"] == "tqdm"
    assert (p["n"], p["total"], p["unit"]) == (50, 50, "it/s") and p["rate"] > 10


def test_trainer_log_lines_give_loss_and_epoch() -> None:
    p = parse_progress(_log("trainer"))
    assert p is not None and p["kind"] == "trainer" and p["total"] == 40
    text = _log("trainer")
    last_loss = text[text.rindex("{'loss': '") + 10:].split("'")[0]
    assert p["metrics"]["loss"] == float(last_loss) and p["metrics"]["epoch"] == 2.5


@pytest.mark.parametrize("name", ["lightning", "lightning_tqdm"])
def test_lightning_bars_give_the_loss(name: str) -> None:
    p = parse_progress(_log(name))
    assert p is not None and p["kind"] == "lightning" and (p["n"], p["total"]) == (32, 32)
    assert p["metrics"]["epoch"] == 1 and abs(p["metrics"]["loss"] - 2.92) < 0.01


def test_slow_tqdm_rates_are_inverted_and_bars_without_total_parse() -> None:
    p = parse_progress("\r  4%|4         | 4/100 [00:08<03:21,  2.10s/it]")
    assert p is not None and p["n"] == 4 and p["unit"] == "it/s" and abs(p["rate"] - 1 / 2.1) < 1e-3
    q = parse_progress("\r1.2kit [00:04, 301.5it/s]")
    assert q is not None and q["n"] == 1200 and "total" not in q


def test_step_marker_round_trip_and_wins_over_a_bar() -> None:
    out = io.StringIO()
    assert mark_step(7, 10, stream=out, loss=0.25, note="text", bad=float("nan"), every_s=0)
    assert not mark_step(8, 10, stream=out, loss=0.2)  # within a second of the last: not written
    assert mark_step(10, 10, stream=out, loss=0.1)  # the last step always is
    p = parse_progress(" 50%|#####     | 5/10 [00:01<00:01,  4.0it/s]\n" + out.getvalue())
    assert p == {"kind": "step", "n": 10, "total": 10, "pct": 100.0, "rate": 4.0, "unit": "it/s",
                 "metrics": {"loss": 0.1}}


def test_no_progress_is_none() -> None:
    assert parse_progress("rank 0 up\nhello\n") is None


def test_raw_samples_count_the_main_threads_collective_share() -> None:
    total, inside, calls = parse_raw((DATA / "py_spy_record_raw.txt").read_text())
    assert (total, inside, dict(calls)) == (19, 17, {"all_reduce": 17})  # tqdm's monitor thread left out


def test_straggler_rule() -> None:
    many = {r: 30 for r in range(4)}
    assert stragglers({0: 90, 1: 5, 2: 88, 3: 92}, many) == {1}
    assert stragglers({0: 90, 1: 5}, {0: 30, 1: 30}) == {1}
    # the landing CI's `top --node node2` of a 2 x 2 job: the median of both (50) let rank 3 pass
    assert stragglers({2: 74, 3: 26}, {2: 30, 3: 30}) == {3}
    assert stragglers({0: 90, 1: 5, 2: 4, 3: 92}, many) == {1, 2}  # two slow ranks: each against the rest
    assert stragglers({0: 30, 1: 14}, {0: 30, 1: 30}) == set()  # below half, but not 20 points below
    assert stragglers({0: 18, 1: 2}, {0: 30, 1: 30}) == set()  # the others hardly wait: nothing to compare
    assert stragglers({0: 10, 1: 2, 2: 12, 3: 9}, many) == set()  # a median under 20 %: nothing to compare
    assert stragglers({0: 90, 1: 60, 2: 88, 3: 92}, many) == set()  # slower, not far below half
    assert stragglers({0: 90, 1: 5, 2: 88, 3: 92}, {0: 30, 1: 3, 2: 30, 3: 30}) == set()  # too few samples


def _sample(rank: int, host: str, inside: int) -> RankSample:
    return RankSample(rank, host, 100 + rank, "sleeping", 5.0, 270.0, 40, inside, {"all_reduce": inside})


def test_gather_joins_logs_and_flags(tmp_path: Path) -> None:
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    (ranks / "rank-0@node1.log").write_text(_log("tqdm"))
    (ranks / "rank-1@node1.log").write_text("rank 1 up\n")
    (ranks / "rank-2@node2.log").write_text("")

    class Log:
        ranks_dir, output = str(ranks), None

    rows = gather([_sample(0, "node1", 36), _sample(1, "node1", 2)], Log(), world=3)
    assert [r.rank for r in rows] == [0, 1, 2]
    assert rows[0].progress and rows[0].progress["n"] == 50 and rows[0].collective_pct == 90.0
    assert rows[1].straggler and not rows[0].straggler
    assert rows[2].state == "gone" and rows[2].host == "node2" and rows[2].quiet_s is not None
    assert set(json.loads(json.dumps(rows[0].to_json()))) >= {
        "rank", "host", "state", "cpu_pct", "rss_mb", "quiet_s", "progress", "collective_pct", "straggler",
        "gpu_util", "gpu_mem_mb"}


def test_table_folds_per_node_above_32_ranks() -> None:
    rows = [RankRow(r, f"node{r // 4}", "sleeping", cpu_pct=5.0, rss_mb=100.0, collective_pct=90.0,
                    straggler=r == 13) for r in range(FOLD_AT + 4)]
    lines = table(rows)
    assert len(lines) == 1 + 9 + 1 and lines[0].startswith("HOST")
    assert any(ln.startswith("node3 ") and ln.rstrip().endswith("13") for ln in lines)
    assert lines[-1].startswith("straggler: rank 13")
    assert len(table(rows[:4])) == 1 + 4  # per rank, nobody flagged


def test_gpu_answers_map_to_processes() -> None:
    apps = [["4242", "GPU-aaa", "1024"], ["4243", "GPU-bbb", "2048"]]
    gpus = [["GPU-aaa", "97"], ["GPU-bbb", "3"]]
    assert gpu_by_pid(apps, gpus) == {4242: (97.0, 1024.0), 4243: (3.0, 2048.0)}
    text = json.dumps({"card0": {"GPU use (%)": "88", "GPU Memory Allocated (VRAM%)": "41"}, "system": {}})
    assert rocm_cards(text) == {0: (88.0, 41.0)}


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "torchhpc", "top", *args], capture_output=True, text=True, timeout=60)


def test_cli_refuses_a_scheduler_without_a_probe_in_one_line() -> None:
    r = _cli("kubernetes:train-1", "--once")
    assert r.returncode == 2 and r.stderr.startswith("Error: torchhpc top cannot reach the ranks of a kubernetes job")
    assert "HINT:" in r.stderr and "Traceback" not in r.stderr


def test_cli_says_pbsdsh_needs_the_job() -> None:
    """PBS jobs are reached with pbsdsh, which only the job's own processes may run: from outside it,
    top says so and names the fix (the body under PBS: tests/integration/test_pbs_body.py)."""
    r = _cli("pbs:12.server", "--dry-run")
    assert r.returncode != 0 and "Error: pbsdsh reaches the nodes of PBS job 12.server only from inside it" in r.stderr
    assert "HINT:" in r.stderr and "qsub -I" in r.stderr and "Traceback" not in r.stderr


def test_cli_dry_run_prints_the_probe_and_bad_filters_are_usage_errors() -> None:
    r = _cli("slurm:123", "--dry-run")
    assert r.returncode == 0 and "srun --overlap --jobid=123" in r.stdout and "torchhpc.observe.sample" in r.stdout
    bad = _cli("slurm:123", "--rank", "3-1", "--json")
    assert bad.returncode == 2 and json.loads(bad.stdout)["error"].startswith("--rank")


def test_start_up_samples_do_not_count() -> None:
    raw = ("<module> (train.py:3);_find_and_load (<frozen importlib._bootstrap>:1176) 30\n"
           "<module> (train.py:9);init_process_group (torch/distributed/distributed_c10d.py:1700);"
           "rendezvous (torch/distributed/rendezvous.py:80) 20\n"
           "<module> (train.py:20);all_reduce (torch/distributed/distributed_c10d.py:3252) 9\n"
           "<module> (train.py:19);compute (train.py:12) 1\n")
    assert parse_raw(raw)[:2] == (10, 9)


def test_progress_bar_redraws_reach_the_local_log() -> None:
    import os

    from torchhpc.core.processes import _pieces

    r, w = os.pipe()
    os.write(w, b"up\n\r 10%|#  | 1/10\r 20%|## | 2/10\rdone\r\n")
    os.close(w)
    with os.fdopen(r, "rb") as pipe:
        assert list(_pieces(pipe)) == [b"up\n", b"\r", b" 10%|#  | 1/10\r", b" 20%|## | 2/10\r", b"done\r\n"]


def test_probe_lines_stay_whole_through_srun() -> None:
    from torchhpc.diagnose.probe import LINE_MAX, RankStack, line_of

    frames = tuple((f"_find_and_load_{i}", "<frozen importlib._bootstrap>", 1176) for i in range(60))
    text = line_of(RankStack(3, "node2", 42, 0.04, (("all_reduce", "torch/distributed/c10d.py", 9), *frames)))
    d = json.loads(text)
    assert len(text) <= LINE_MAX and d["frames"][0] == ["all_reduce", "torch/distributed/c10d.py", 9]
    assert 0 < len(d["frames"]) < 61
    for s in (RankSample(0, "n", 1, "sleeping", 1.0, 2.0, 40, 30, {"all_reduce": 30}, error="x" * 5000),):
        from dataclasses import asdict

        assert len(json.dumps(asdict(s) | {"error": s.error[:300]})) <= LINE_MAX


def test_a_rank_still_importing_is_not_a_hang(tmp_path: Path) -> None:
    from torchhpc.diagnose import hang
    from torchhpc.diagnose.probe import RankStack

    ranks = tmp_path / "ranks"
    ranks.mkdir()
    (ranks / "rank-0@n1.log").write_text("")
    importing = (("_find_and_load", "<frozen importlib._bootstrap>", 1176), ("<module>", "train.py", 1))
    stacks = [RankStack(0, "n1", 1, 0.03, importing)]
    acted: list[str] = []
    watch = hang.HangWatch({}, 5.0, "cancel", str(ranks), str(tmp_path), lambda: None, acted.append,
                           lambda _line: None)
    real = hang.probe_job
    hang.probe_job = lambda *a, **k: stacks  # type: ignore[assignment]
    try:
        assert watch.check("RUNNING", now=(ranks / "rank-0@n1.log").stat().st_mtime + 60) is None
    finally:
        hang.probe_job = real  # type: ignore[assignment]
    assert not acted and not watch.fired


def test_each_rank_of_the_local_log_keeps_its_own_tqdm_bar(tmp_path: Path) -> None:
    """The local log's tqdm redraws end in \\r, not a newline: rank 1's bar must not land on rank 0
    (seen: rank 0 showed '-' and rank 1 the description '[rank0]'). The bytes are those of a real
    2-rank gloo job whose ranks both ran tqdm with desc=f"[rank{r}]" (one redraw each, shortened)."""
    out = tmp_path / "output.log"
    out.write_bytes(
        b"[rank0]: up\n[rank1]: up\n"
        b"[rank0]: [rank0]:  11%|\xe2\x96\x88         | 218/2000 [00:10<01:29, 19.89it/s]"
        b"\r[rank1]: [rank1]:   5%|\xe2\x96\x8c         | 110/2000 [00:11<03:09,  9.95it/s]"
        b"\r[rank0]: [rank0]:  11%|\xe2\x96\x88         | 220/2000 [00:11<01:29, 19.89it/s]"
    )

    class Log:
        ranks_dir, output = None, str(out)

    rows = gather([_sample(0, "localhost", 1), _sample(1, "localhost", 1)], Log(), world=2)
    got = {r.rank: (r.progress or {}).get("n") for r in rows}
    assert got == {0: 220, 1: 110}, got


def test_gpu_health_reads_throttle_reasons_ecc_and_xids() -> None:
    """nvidia-smi's CSV (``--query-gpu=uuid,pci.bus_id,clocks_event_reasons.active,
    ecc.errors.uncorrected.volatile.total --format=csv,noheader``) and the kernel's ``NVRM: Xid`` lines,
    in their documented formats: no NVIDIA GPU here (the GPU run of docs/observe.md read a real one)."""
    from torchhpc.observe.sample import gpu_health

    rows = [["GPU-a", "00000000:18:00.0", "0x0000000000000000", "0"],
            ["GPU-b", "00000000:3B:00.0", "0x0000000000000040", "2"],
            ["GPU-c", "00000000:86:00.0", "0x0000000000000001", "[N/A]"]]
    log = "[ 12.3] NVRM: Xid (PCI:0000:86:00): 79, pid=1234, GPU has fallen off the bus.\n"
    assert gpu_health(rows, log) == {"GPU-a": "ok", "GPU-b": "hw-thermal,ecc:2", "GPU-c": "xid:79"}


def test_a_power_capped_gpu_is_not_a_fault() -> None:
    """An H200 at 100 % reports SW power cap (0x4) all the time: normal operation, shown apart after "ok"
    (top showed "power-cap" in GPU_HEALTH, issue 51 item 11); heat and hardware slowdowns are faults."""
    from torchhpc.observe.sample import gpu_health

    rows = [["GPU-busy", "00000000:18:00.0", "0x0000000000000004", "0"],
            ["GPU-hot", "00000000:3B:00.0", "0x0000000000000024", "0"],  # capped and sw thermal slowdown
            ["GPU-slow", "00000000:86:00.0", "0x0000000000000088", "0"],  # hw slowdown, power brake
            ["GPU-idle", "00000000:87:00.0", "0x0000000000000001", "0"]]
    got = gpu_health(rows, "")
    assert got == {"GPU-busy": "ok (capped)", "GPU-hot": "sw-thermal", "GPU-slow": "hw-slowdown,power-brake",
                   "GPU-idle": "ok"}
    row = table([RankRow(0, "n1", "running", gpu_health=got["GPU-busy"])])[1]
    assert "ok (capped)" in row and "power-cap" not in row


def test_the_gpu_health_column_shows_only_where_a_gpu_answered() -> None:
    plain = table([RankRow(0, "n1", "running")])
    assert "GPU_HEALTH" not in plain[0]
    gpu = table([RankRow(0, "n1", "running", gpu_health="hw-thermal"), RankRow(1, "n1", "running", gpu_health="ok")])
    assert "GPU_HEALTH" in gpu[0] and "hw-thermal" in gpu[1] and " ok " in gpu[2]
