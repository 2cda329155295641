"""A local job's ranks forked from one standby (schedulers/local/warm.py): real ranks, a real standby, real torch.

Whether a rank started warm is what it finds before its own first import: ``torch`` already in
``sys.modules``. Each run here imports torch once (the standby's), or once per rank when cold.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import hang_timeout
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
    """Rank 0 fails once rank 1 ignores SIGTERM (a file says so: at load rank 1 could be killed before it had said
    its pid); its client is killed after the grace, and the rank in the standby's fork goes with the standby's end,
    not later."""
    program = PROGRAM.format(imports="import signal, time, torch") + "\n"
    ready = str(tmp_path / "rank1-ignores-sigterm")
    program = program.replace("sys.exit(", "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('pid', os.getpid(), flush=True)\n"
                              f"if os.environ['RANK'] == '1':\n    open({ready!r}, 'w').close()\n    time.sleep(120)\n"
                              f"t = time.monotonic()\nwhile not os.path.exists({ready!r}) and time.monotonic() - t < 60:\n"
                              "    time.sleep(0.02)\nsys.exit(")
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


def _standby_under(root: int) -> tuple[int, str] | None:
    """(pid, abstract address) of a warm standby started below process ``root``, once it has bound."""
    for name in os.listdir("/proc"):
        try:
            argv = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"serve" not in argv or not any(a.endswith(b"warm.py") for a in argv):
            continue
        pid = int(name)
        while pid > 1 and pid != root:
            try:
                pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                break
        if pid == root:
            address = argv[argv.index(b"serve") + 1].decode()
            bound = any(address in line for line in Path("/proc/net/unix").read_text().splitlines())
            return (int(name), address) if bound else None
    return None


def test_ranks_waiting_for_a_slow_standby_are_not_a_hang(tmp_path: Path) -> None:
    """CI of stop 74: at load 30 the standby took longer to import torch than --hang-timeout, its clients sat
    idle in socket.py, and the watch cancelled the run as a hang before any rank had started. Here the standby
    is stopped (SIGSTOP) once bound, for three hang timeouts: the run must start late and finish, no verdict."""
    import contextlib
    import signal
    import subprocess
    import sys
    import time

    (tmp_path / "prog.py").write_text(PROGRAM.format(imports="import torch"))
    env = {**os.environ, "TORCHHPC_STATE_DIR": str(tmp_path / "state")}
    timeout = hang_timeout(5)  # run 22: at load 30 a rank's exit alone took over 5 s, and was called a hang at exit
    proc = subprocess.Popen([sys.executable, "-m", "torchhpc", "run", "-n", "2", "--hang-timeout", timeout, "prog.py"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    found, deadline = None, time.monotonic() + 60
    while found is None and proc.poll() is None and time.monotonic() < deadline:
        found = _standby_under(proc.pid)
        time.sleep(0.005)
    assert found, f"no warm standby seen: {proc.communicate()}"
    os.kill(found[0], signal.SIGSTOP)
    try:
        time.sleep(3 * int(timeout) + 1)  # the watch's first probe comes once the ranks' log is quiet for a timeout
    finally:
        with contextlib.suppress(ProcessLookupError):  # the run may have ended it (a hang verdict cancels)
            os.kill(found[0], signal.SIGCONT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "hang" not in err.lower(), err
    assert sorted(x.split()[1:5] for x in out.splitlines() if " warm " in x) == [["rank", "0", "warm", "True"],
                                                                                ["rank", "1", "warm", "True"]], out
