"""torchhpc.jobdir.logs and ``torchhpc logs``: attribution, filters, tracebacks, follow."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from torchhpc.cli.main import main
from torchhpc.jobdir.log_wiring import LOG_WRAPPER, job_dir, log_argv, ranks_dir_ref, torchrun_per_rank
from torchhpc.jobdir.logs import (
    MAX_RANKS,
    JobLog,
    Line,
    format_ranks,
    log_text,
    parse_line,
    parse_ranks,
    rank_files,
    select,
)
from torchhpc.jobdir.tracebacks import first_tracebacks


@pytest.mark.parametrize(
    ("line", "launcher", "nproc", "rank", "text"),
    [
        ("12: hello", "srun", 4, 12, "hello"),
        ("  3: [rank13]: hello", "torchrun", 4, 13, "hello"),
        ("3: [default1]:hello", "torchrun", 4, 13, "hello"),
        ("3: W1123 torch/distributed/elastic ...", "torchrun", 4, None, "W1123 torch/distributed/elastic ..."),
        ("1: [1]:", "torchrun", 4, None, "[1]:"),  # torchrun's failure summary, not a rank's line
        ("[1,12]<stdout>:hello", "mpirun", 4, 12, "hello"),
        ("[1,7]<stderr>: Traceback", "mpirun", 4, 7, "Traceback"),
        ("[rank5]: hello", "srun", 1, 5, "hello"),
        ("torchhpc: job 7 on node[1-2]", "srun", 1, None, "torchhpc: job 7 on node[1-2]"),
        ("srun: error: node2: task 3: Exited with exit code 1", "srun", 1, None, "srun: error: node2: task 3: Exited with exit code 1"),
    ],
)
def test_parse_line_every_launcher_prefix(line: str, launcher: str, nproc: int, rank: int | None, text: str) -> None:
    assert parse_line(line, launcher, nproc) == Line(rank, text)


def test_parse_ranks() -> None:
    assert parse_ranks("3") == [3]
    assert parse_ranks("7,3") == [3, 7]
    assert parse_ranks("0-2,8") == [0, 1, 2, 8]
    for bad in ("", "a", "3,", "1-", "-1"):
        with pytest.raises(ValueError):
            parse_ranks(bad)


def test_parse_ranks_refuses_absurd_ranges_before_expanding_them() -> None:
    assert parse_ranks(f"0-{MAX_RANKS - 1}")[-1] == MAX_RANKS - 1
    assert parse_ranks("5-5") == [5]
    for bad, why in [
        ("0-999999999", "spans 1000000000 ranks"),
        ("3-1", "ends before it starts"),
        (f"0-{MAX_RANKS - 1},{MAX_RANKS}", f"more than {MAX_RANKS} ranks"),
        ("0-" + "9" * 40, "more than"),
    ]:
        with pytest.raises(ValueError, match=why):
            parse_ranks(bad)


def test_format_ranks_inverts_parse_ranks() -> None:
    assert format_ranks([]) == ""
    assert format_ranks([8, 0, 1, 2, 2]) == "0-2,8"
    assert format_ranks([3, 5, 6]) == "3,5-6"
    assert parse_ranks(format_ranks([0, 1, 2, 8, 10, 11])) == [0, 1, 2, 8, 10, 11]


@pytest.mark.parametrize(("value", "why"), [("0-999999999", "spans"), ("3-1", "ends before it starts")])
def test_cli_absurd_rank_range_is_a_usage_error(value: str, why: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["logs", "local:nosuchjob", "--rank", value]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"Error: --rank {value!r} is not a rank list: ") and why in err
    assert "HINT: " in err and "Traceback" not in err


def _ranks_dir(tmp_path: Path, files: dict[str, str]) -> Path:
    d = tmp_path / "job" / "ranks"
    d.mkdir(parents=True)
    for name, text in files.items():
        (d / name).write_text(text)
    return d


def test_rank_files_sorted_numerically_with_nodes(tmp_path: Path) -> None:
    d = _ranks_dir(tmp_path, {"rank-10@node3.log": "", "rank-2@node1.log": "", "rank-1.log": "", "other.txt": ""})
    found = rank_files(str(d))
    assert list(found) == [1, 2, 10]
    assert found[10] == (str(d / "rank-10@node3.log"), "node3")
    assert found[1][1] == ""


def test_joblog_reads_whole_lines_and_holds_a_partial_one(tmp_path: Path) -> None:
    d = _ranks_dir(tmp_path, {"rank-0@n1.log": "a\nb", "rank-1@n2.log": "c\n"})
    out = tmp_path / "slurm.out"
    out.write_text("torchhpc: job 5\n")
    log = JobLog(output=str(out), ranks_dir=str(d), launcher="mpirun")
    assert log.read() == [Line(None, "torchhpc: job 5"), Line(0, "a", "n1"), Line(1, "c", "n2")]
    assert log.read() == []  # "b" has no newline yet
    with open(d / "rank-0@n1.log", "a") as f:
        f.write("c\nd")
    assert log.read() == [Line(0, "bc", "n1")]
    assert log.read(final=True) == [Line(0, "d", "n1")]
    assert log.nodes() == {0: "n1", 1: "n2"}


def test_select_by_rank_node_grep() -> None:
    lines = [Line(None, "job"), Line(0, "a", "n1"), Line(1, "b x", "n1"), Line(5, "c x")]
    assert select(lines, ranks=[1, 5]) == lines[2:]
    assert select(lines, nodes=["n1"]) == lines[1:3]
    assert select(lines, nodes=["n2"], node_of={5: "n2"}) == [lines[3]]
    assert select(lines, grep=re.compile(r"\bx$")) == lines[2:]


TB = [
    "Traceback (most recent call last):",
    '  File "x.py", line 3, in <module>',
    "    boom()",
    "RuntimeError: boom",
]


def test_first_traceback_per_rank_ordered_by_position_or_failure_time() -> None:
    lines = [Line(1, "start"), *(Line(3, t) for t in TB), Line(1, "more"), *(Line(1, t) for t in TB[:3]),
             Line(0, "not yet"), Line(1, "ValueError: second"), *(Line(3, t) for t in TB)]
    tbs = first_tracebacks(lines)
    assert [r for r, _ in tbs.by_rank] == [3, 1]
    assert tbs.by_rank[0][1] == tuple(TB)  # only the first of rank 3's two
    assert tbs.by_rank[1][1] == (*TB[:3], "ValueError: second")
    assert "=== rank 3 (failed first) ===" in tbs.render()
    assert [r for r, _ in first_tracebacks(lines, {1: 10.0, 3: 20.0}).by_rank] == [1, 3]
    assert not first_tracebacks([Line(0, "fine")])


def test_a_stdout_line_merged_into_a_traceback_does_not_end_it() -> None:
    """A rank's stdout and stderr are two pipes: at load, a line the program printed before it raised can arrive
    between the traceback's lines (run 3 of issue 66: `logs --errors` ended the block at "index 0" and lost
    "ValueError: bad value"). The exception line still ends the block; the stdout line is not part of it."""
    merged = [TB[0], TB[1], "index 0", *TB[2:]]
    assert first_tracebacks([Line(0, t) for t in merged]).by_rank == ((0, tuple(TB)),)


def test_chained_traceback_is_one_block() -> None:
    texts = [*TB, "", "During handling of the above exception, another exception occurred:", "", *TB[:3], "KeyError: 'k'", "after"]
    tbs = first_tracebacks([Line(2, t) for t in texts])
    assert tbs.by_rank[0][1] == tuple(texts[:-1])


def test_log_wrapper_sends_each_rank_to_its_own_file(tmp_path: Path) -> None:
    """The wrapper run by a real bash: stdout and stderr appended to rank-N@HOST.log, the command exec'd."""
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    env = {**os.environ, "RANK": "7", "TORCHHPC_RANKS_DIR": str(ranks)}
    env.pop("PYTHONUNBUFFERED", None)
    cmd = log_argv(["bash", "-c", 'echo out; echo err >&2; echo "$PYTHONUNBUFFERED"; exit 3'])
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert done.returncode == 3 and done.stdout == "" and done.stderr == ""
    (path, node), = rank_files(str(ranks)).values()
    assert Path(path).read_text() == "out\nerr\n1\n"
    assert node and "." not in node
    # the first set variable of the list names the rank (mpirun's before a stale RANK)
    subprocess.run(log_argv(["true"], "OMPI_COMM_WORLD_RANK RANK"), env={**env, "OMPI_COMM_WORLD_RANK": "2"}, check=True)
    subprocess.run(log_argv(["true"], "PMI_RANK"), env=env, check=True)
    assert sorted(rank_files(str(ranks))) == [0, 2, 7]
    # no directory (a script submitted by hand): the output stays on the launcher's stream, silently
    gone = subprocess.run(log_argv(["echo", "hi"]), env={**env, "TORCHHPC_RANKS_DIR": str(tmp_path / "none")}, capture_output=True, text=True)
    assert (gone.stdout, gone.stderr) == ("hi\n", "")
    assert not (tmp_path / "none").exists()
    # a directory that cannot be written: said on stderr, output kept
    bad = subprocess.run(["bash", LOG_WRAPPER, "RANK", "echo", "hi"], env={**env, "TORCHHPC_RANKS_DIR": "/proc"}, capture_output=True, text=True)
    assert bad.stdout == "hi\n" and "cannot write" in bad.stderr


def _record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **fields: object) -> None:
    state = tmp_path / "state"
    (state / "jobs").mkdir(parents=True)
    monkeypatch.setenv("TORCHHPC_STATE_DIR", str(state))
    (state / "jobs" / "slurm-42.json").write_text(json.dumps({"scheduler": "slurm", "job_id": "42", **fields}))


def test_cli_rank_node_grep_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    job = tmp_path / "job"
    _ranks_dir(tmp_path, {
        "rank-0@node1.log": "a0\nb0\n",
        "rank-1@node1.log": "a1\n" + "\n".join(TB) + "\n",
        "rank-2@node2.log": "a2\n" + "\n".join(TB[:3]) + "\nOSError: peer\n",
    })
    os.utime(job / "ranks" / "rank-1@node1.log", (100, 100))
    os.utime(job / "ranks" / "rank-2@node2.log", (50, 50))
    (job / "slurm.out").write_text("torchhpc: job 42\n")
    _record(tmp_path, monkeypatch, job_dir=str(job), output_path=str(job / "slurm.out"), launcher="torchrun", nproc_per_node=2)

    def run(*argv: str) -> str:
        assert main(["logs", "slurm:42", *argv]) == 0
        return capsys.readouterr().out

    assert run().splitlines()[:3] == ["torchhpc: job 42", "[rank0]: a0", "[rank0]: b0"]
    assert run("--rank", "0") == "a0\nb0\n"
    assert run("--rank", "0,2").splitlines() == ["[rank0]: a0", "[rank0]: b0", "[rank2]: a2", *(f"[rank2]: {t}" for t in TB[:3]), "[rank2]: OSError: peer"]
    assert run("--node", "node2").splitlines()[0] == "[rank2]: a2"
    assert run("--node", "node[1-2]").count("\n") == run().count("\n") - 1
    assert run("--grep", "^a[12]$") == "[rank1]: a1\n[rank2]: a2\n"
    errors = run("--errors")
    assert errors.index("=== rank 2 (failed first) ===") < errors.index("=== rank 1 ===")
    assert "OSError: peer" in errors and "a0" not in errors


@pytest.mark.parametrize(("flag", "value"), [("--rank", "x"), ("--grep", "("), ("--node", "node[1-")])
def test_cli_bad_filters(flag: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["logs", "slurm:42", flag, value]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"Error: {flag} ") and "HINT: " in err


def test_torchrun_workers_go_through_the_wrapper() -> None:
    torchrun = ["python", "-m", "torch.distributed.run", "--nnodes", "2", "--tee", "3", "--no-python", "bash", "SHIM", "torchrun", "python", "train.py"]
    argv = torchrun_per_rank(torchrun)
    assert argv[:5] == ["python", "-m", "torch.distributed.run", "--nnodes", "2"]
    assert argv[5:] == ["--no-python", "bash", '"$TORCHHPC_BOOT_DIR/rank.sh"', "RANK", "bash", "SHIM", "torchrun", "python", "train.py"]


def test_ranks_dir_ref_expands_in_bash(tmp_path: Path) -> None:
    ref = ranks_dir_ref(str(tmp_path / "out $(x)" / "job 'a'.sbatch"), "$SLURM_JOB_ID")
    done = subprocess.run(["bash", "-c", f"printf %s {ref}"], env={"SLURM_JOB_ID": "77"}, capture_output=True, text=True)
    assert done.stdout == str(tmp_path / "out $(x)" / "job 'a'-77" / "ranks")
    assert job_dir("/o/pi.sbatch", "77") == "/o/pi-77"


def test_log_text(tmp_path: Path) -> None:
    d = _ranks_dir(tmp_path, {"rank-0@n1.log": "a\n", "rank-1@n1.log": "b\nc"})
    assert log_text(JobLog(ranks_dir=str(d))) == "[rank0]: a\n[rank1]: b\n[rank1]: c\n"
    assert log_text(JobLog(ranks_dir=str(d)), rank=1) == "b\nc\n"


def test_cli_rank_or_node_not_in_the_log_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    job = tmp_path / "job"
    _ranks_dir(tmp_path, {"rank-0@node1.log": "a0\n", "rank-1@node2.log": "a1\n"})
    (job / "slurm.out").write_text("torchhpc: job 42\n")
    _record(tmp_path, monkeypatch, job_dir=str(job), output_path=str(job / "slurm.out"), launcher="srun")

    def refused(*argv: str) -> list[str]:
        assert main(["logs", "slurm:42", *argv]) == 2
        out, err = capsys.readouterr()
        assert out == "" and "Traceback" not in err
        return err.splitlines()

    assert refused("--rank", "5") == ["Error: the log of slurm:42 has no line from rank 5", "HINT: the log has ranks 0-1"]
    assert refused("--rank", "2-4,9")[0] == "Error: the log of slurm:42 has no line from ranks 2-4,9"
    assert refused("--node", "node9") == [
        "Error: the log of slurm:42 has no line from any rank on node9",
        "HINT: the log has ranks 0-1 on node1,node2",
    ]
    assert refused("--rank", "0", "--node", "node2")[0] == "Error: the log of slurm:42 has no line from rank 0 on node2"
    # some of the asked ranks are there: their lines, as before
    assert main(["logs", "slurm:42", "--rank", "1,5"]) == 0
    assert capsys.readouterr().out == "[rank1]: a1\n"
    # a --grep that matches nothing in ranks that exist is no error
    assert main(["logs", "slurm:42", "--rank", "0", "--grep", "zzz"]) == 0
    assert capsys.readouterr().out == ""
    # --errors keeps its own answer
    assert main(["logs", "slurm:42", "--rank", "5", "--errors"]) == 0
    assert "No traceback" in capsys.readouterr().err


def test_cli_rank_filter_on_a_log_without_rank_lines_prints_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    job = tmp_path / "job"
    job.mkdir()
    (job / "slurm.out").write_text("torchhpc: job 42\nsrun: error: something\n")
    _record(tmp_path, monkeypatch, job_dir=str(job), output_path=str(job / "slurm.out"), launcher="srun")
    assert main(["logs", "slurm:42", "--rank", "5"]) == 0
    assert capsys.readouterr().out == ""
