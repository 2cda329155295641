"""A local job's ranks forked from one standby (schedulers/local/warm.py): real ranks, a real standby, real torch.

Whether a rank started warm is what it finds before its own first import: ``torch`` already in
``sys.modules``. Each run here imports torch once (the standby's), or once per rank when cold.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from torchhpc.core.spec import ContainerSpec, Entrypoint, JobSpec
from torchhpc.schedulers import get_scheduler
from torchhpc.schedulers.local.warm import LocalStandby

PROGRAM = """\
import os, sys
warm = "torch" in sys.modules
{imports}
print("rank", os.environ["RANK"], "warm", warm, "parent", os.getppid(), flush=True)
sys.exit(int(os.environ["RANK"]) + 3 if sys.argv[1:] == ["fail"] else 0)
"""


def _run(tmp_path: Path, capsys: pytest.CaptureFixture[str], program: str, nproc: int = 2, *args: str,
         env: tuple[tuple[str, str], ...] = ()) -> tuple[int, list[str]]:
    (tmp_path / "prog.py").write_text(program)
    spec = JobSpec(entrypoint=Entrypoint.parse([str(tmp_path / "prog.py"), *args]), nproc_per_node=nproc, env=env)
    sched = get_scheduler("local")
    job = sched.schedule(sched.render(spec))
    lines = [line for line in capsys.readouterr().out.splitlines() if " warm " in line]
    return sched.status(job).exit_code or 0, sorted(lines)


def test_two_ranks_that_import_torch_are_forked_from_one_standby(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    code, lines = _run(tmp_path, capsys, PROGRAM.format(imports="import torch"))
    assert code == 0 and [x.split()[:4] for x in lines] == [["[rank0]:", "rank", "0", "warm"],
                                                             ["[rank1]:", "rank", "1", "warm"]]
    assert all(x.split()[4] == "True" for x in lines), lines
    assert len({x.split()[6] for x in lines}) == 1 and str(os.getpid()) not in {x.split()[6] for x in lines}


def test_a_failing_warm_rank_is_the_jobs_exit_code(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, lines = _run(tmp_path, capsys, PROGRAM.format(imports="import torch"), 2, "fail")
    assert code in (3, 4) and any("True" in x for x in lines), lines


@pytest.mark.parametrize("case", ["switched off", "no torch in the source", "one rank"])
def test_what_does_not_pay_starts_cold(tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str) -> None:
    program = PROGRAM.format(imports="" if case == "no torch in the source" else "import torch")
    env = (("TORCHHPC_WARM", "off"),) if case == "switched off" else ()
    code, lines = _run(tmp_path, capsys, program, 1 if case == "one rank" else 2, env=env)
    assert code == 0 and lines and all(x.split()[4] == "False" for x in lines), lines


def test_a_module_of_torch_is_wanted_and_a_container_is_not() -> None:
    spec = JobSpec(entrypoint=Entrypoint.parse([], module="json.tool"), nproc_per_node=2)
    assert not LocalStandby(spec, ["python", "-m", "json.tool"], {}, "x").wanted  # json.tool names no torch
    spec = JobSpec(entrypoint=Entrypoint.parse([], module="torch.utils.collect_env"), nproc_per_node=2)
    assert LocalStandby(spec, ["python", "-m", "torch.utils.collect_env"], {}, "x").wanted
    boxed = spec.with_(container=ContainerSpec(image="img.sif"))
    assert not LocalStandby(boxed, ["python", "-m", "torch.utils.collect_env"], {}, "x").wanted


def test_a_warm_rank_that_ignores_sigterm_is_gone_when_the_run_ends(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Rank 0 fails; rank 1 ignores SIGTERM: its client is killed after the grace, and the rank in the standby's
    fork goes with the standby's end, not later."""
    program = PROGRAM.format(imports="import signal, time, torch") + "\n"
    program = program.replace("sys.exit(", "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('pid', os.getpid(), flush=True)\n"
                              "time.sleep(0 if os.environ['RANK'] == '0' else 120)\nsys.exit(")
    (tmp_path / "prog.py").write_text(program)
    spec = JobSpec(entrypoint=Entrypoint.parse([str(tmp_path / "prog.py"), "fail"]), nproc_per_node=2,
                   options=(("grace", "0.5"),))
    sched = get_scheduler("local")
    job = sched.schedule(sched.render(spec))
    out = capsys.readouterr().out
    pids = [int(line.split()[-1]) for line in out.splitlines() if " pid " in line]
    assert sched.status(job).exit_code == 3 and len(pids) == 2, out
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except FileNotFoundError:
            continue
        assert stat.split(") ", 1)[1][0] == "Z", f"rank pid {pid} is still running"
