"""Job arrays: parsing (core/array.py), rendering for Slurm/PBS, refusal elsewhere, and the
run-time ``{index}`` substitution run by a real bash over hostile values."""

from __future__ import annotations

import os
import subprocess

import pytest

from torchhpc.core.array import parse_array, substitute
from torchhpc.core.spec import Entrypoint, JobSpec
from torchhpc.errors import SpecError
from torchhpc.schedulers.batch.step import array_lines
from torchhpc.schedulers.slurm.slurm import expand_output, output_pattern


@pytest.mark.parametrize(
    "text, indices, parallel, slurm",
    [
        ("0-3", (0, 1, 2, 3), None, "0-3"),
        ("1,3,7", (1, 3, 7), None, "1,3,7"),
        ("0-31%4", tuple(range(32)), 4, "0-31%4"),
        ("0-6:2,9", (0, 2, 4, 6, 9), None, "0,2,4,6,9"),
        ("5", (5,), None, "5"),
        ("2,0-1", (0, 1, 2), None, "0-2"),
    ],
)
def test_parse(text: str, indices: tuple[int, ...], parallel: int | None, slurm: str) -> None:
    arr = parse_array(text)
    assert arr.indices == indices and arr.parallel == parallel and arr.slurm() == slurm


@pytest.mark.parametrize("bad", ["", "a", "3-1", "0-3%0", "0-3%x", "1,,2", "-1", "0-3:0", "0-99999", "0-3 ; id"])
def test_parse_refuses(bad: str) -> None:
    with pytest.raises(SpecError) as e:
        parse_array(bad)
    assert e.value.hint


def test_pbs_pro_range_only() -> None:
    assert parse_array("0-14:2%3").pbs_pro() == "0-14:2%3"
    with pytest.raises(SpecError):
        parse_array("1,3,7").pbs_pro()


def test_spec_validates_and_params_match() -> None:
    ep = Entrypoint.parse(["t.py"])
    with pytest.raises(SpecError):
        JobSpec(ep, array="x")
    with pytest.raises(SpecError):
        JobSpec(ep, array="0-1", array_params=(("lr", ("1",)),))
    assert JobSpec(ep, array="0-1", array_params=(("lr", ("1", "2")),)).array_spec.count == 2  # type: ignore[union-attr]


def test_output_per_task(tmp_path: object) -> None:
    spec = JobSpec(Entrypoint.parse(["t.py"]), array="0-3", output_dir=str(tmp_path), name="a")
    pat = output_pattern(spec)
    assert pat.endswith("%x-%A_%a.out")
    assert expand_output(pat, "a", "12_3").endswith("/a-12_3.out")


HOSTILE = ["a 0", 'a"=0"', "a'; echo foo", "a\\=", "x\ny", "$HOME", "$(touch pwned)", "&", "\\&", "{index}{index}", "*"]


def test_substitution_in_real_bash(tmp_path: object) -> None:
    """The rendered lines, run by bash, give each argument back exactly, {index}/{lr} replaced."""
    args = ("--", "--lr", "{lr}", "pre{index}post", *HOSTILE)
    values = tuple(HOSTILE[:3])
    spec = JobSpec(Entrypoint.parse(["t.py", *args]), array="4,7,9", array_params=(("lr", values),))
    lines, new = array_lines(spec, "9")
    assert new.entrypoint.args[0] == "--"
    script = "\n".join(["set -euo pipefail", *lines, 'printf "%s\\0" "${_torchhpc_args[@]}"'])
    out = subprocess.run(["bash", "-c", script], cwd=str(tmp_path), capture_output=True, check=True).stdout
    got = out.decode().split("\0")[:-1]
    assert got == substitute(list(args[1:]), {"index": "9", "lr": values[2]})
    assert got[1] == values[2] and got[2] == "pre9post" and "99" in got
    assert not os.path.exists(os.path.join(str(tmp_path), "pwned"))


def test_kubernetes_refuses_arrays() -> None:
    from torchhpc.schedulers import get_scheduler

    spec = JobSpec(Entrypoint.parse(["t.py"]), array="0-1", scheduler="kubernetes")
    with pytest.raises(SpecError) as e:
        get_scheduler("kubernetes").render(spec)
    assert "no job arrays" in e.value.message


# scontrol/sacct output copied from the dev cluster (Slurm 22.05), array job 1, task 2 exited 3.
SCONTROL = """JobId=1 ArrayJobId=1 ArrayTaskId=3 JobName=t JobState=COMPLETED Reason=None Restarts=0 ExitCode=0:0 NodeList=node1
JobId=4 ArrayJobId=1 ArrayTaskId=2 JobName=t JobState=FAILED Reason=NonZeroExitCode Restarts=1 ExitCode=3:0 NodeList=node1
JobId=3 ArrayJobId=1 ArrayTaskId=1 JobName=t JobState=RUNNING Reason=None Restarts=0 ExitCode=0:0 NodeList=node1
JobId=5 ArrayJobId=1 ArrayTaskId=4-5%2 JobName=t JobState=PENDING Reason=JobArrayTaskLimit Restarts=0 ExitCode=0:0 NodeList=
"""
SACCT = "1_0|COMPLETED|0:0|00:00:01|node1|t\n1_2|FAILED|3:0|00:00:00|node1|t\n1_[3-4%2]|PENDING|0:0|00:00:00|None|t\n"


def test_array_summary_from_scontrol_and_sacct() -> None:
    from torchhpc.schedulers.slurm.array import summarise, tasks_from_sacct, tasks_from_scontrol
    from torchhpc.schedulers.slurm.parse import parse_scontrol
    from torchhpc.schedulers.slurm.parse import status_from_scontrol as _status_from_scontrol

    tasks = tasks_from_scontrol("1", SCONTROL, parse_scontrol, _status_from_scontrol)
    assert [t.job_id for t in tasks] == ["1_1", "1_2", "1_3", "1_4", "1_5"]
    st = summarise("1", tasks)
    assert st.state == "RUNNING" and not st.terminal and "failed: 2 (exit 3)" in st.reason and st.restarts == 1
    done = summarise("1", [t for t in tasks if t.terminal])
    assert done.state == "FAILED" and done.exit_code == 3
    assert summarise("1", [tasks[2]]).state == "COMPLETED"
    rows = tasks_from_sacct("1", SACCT)
    assert [(t.job_id, t.state, t.exit_code) for t in rows] == [
        ("1_0", "COMPLETED", 0), ("1_2", "FAILED", 3), ("1_3", "PENDING", None), ("1_4", "PENDING", None)]  # not ended: no code


def test_local_array_runs_each_task_with_its_own_port(tmp_path: object) -> None:
    """Real processes: 3 tasks, 2 at a time, {index} in exact argv, task 2 fails and is named."""
    import io
    import sys

    from torchhpc.errors import JobFailed
    from torchhpc.schedulers.local.local import LocalScheduler

    prog = os.path.join(str(tmp_path), "t.py")
    with open(prog, "w") as f:
        f.write("import json, os, sys\n"
                "print(os.environ['TORCHHPC_ARRAY_INDEX'], os.environ['TORCHHPC_ARRAY_COUNT'],"
                " os.environ['MASTER_PORT'], json.dumps(sys.argv[1:]))\n"
                "sys.exit(3 if os.environ['TORCHHPC_ARRAY_INDEX'] == '2' else 0)\n")
    spec = JobSpec(Entrypoint.parse([prog, "{index}", "a'{index}&$HOME"], python=sys.executable), array="0-2%2")
    sched = LocalScheduler()
    out = io.StringIO()
    with pytest.raises(JobFailed) as e:
        sched.run(sched.render(spec), stdout=out, stderr=io.StringIO())
    assert "2 (exit 3)" in e.value.message and e.value.exit_code == 3
    import json
    import re

    rows = {m[0]: m for m in re.findall(r"^\[task (\d)\] \[rank0\]: (\d) 3 (\d+) (.*)$", out.getvalue(), re.M)}
    assert sorted(rows) == ["0", "1", "2"]
    for i, (task, index, _port, argv) in rows.items():
        assert task == index == i and json.loads(argv) == [i, f"a'{i}&$HOME"]
    assert len({r[2] for r in rows.values()}) == 3
