"""Done is done (issue 65): the rank boot marks when a rank's program returned, and the hang watch
lets a job whose every rank returned complete, naming who hung at exit and where.

The marks come from real interpreters started with the boot on their path (no torch needed: the
mark is the boot's own, stdlib only); the watch is fed RankStacks as the probe returns them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from torchhpc.boot import sitecustomize as boot
from torchhpc.diagnose import exits, hang
from torchhpc.diagnose.probe import EXITED, RankStack
from torchhpc.jobdir.layout import HANG
from torchhpc.launchers.boot import boot_pythonpath
from torchhpc.schedulers.local.ranks import new_run_id


def ended_by(tmp_path: Path, code: str, rank: int = 0, world: int = 1, **env: str) -> dict[int, exits.Ended]:
    """Run ``code`` as rank ``rank`` of a job whose directory is ``tmp_path``; the marks it left."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHHPC_", "RANK", "WORLD_SIZE"))}
    full.update(PYTHONPATH=boot_pythonpath(dict(os.environ)) or "", TORCHHPC_JOB_DIR=str(tmp_path), RANK=str(rank),
                WORLD_SIZE=str(world), **env)
    subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=120)
    return exits.read(str(tmp_path))


def test_the_boot_and_the_reader_name_one_folder() -> None:
    assert boot.ENDED_DIR == exits.ENDED_DIR


@pytest.mark.parametrize(("code", "how"), [
    ("print('done')", "returned"),
    ("import sys; sys.exit(0)", "exit 0"),
    ("import sys; sys.exit(3)", "exit 3"),
    ("raise ValueError('bad batch')", "raised ValueError"),
    ("import sys; sys.excepthook = lambda *a: None; raise KeyError('x')", "raised KeyError"),  # the user's own hook
])
def test_a_rank_marks_how_its_program_ended(tmp_path: Path, code: str, how: str) -> None:
    marks = ended_by(tmp_path, code, rank=1, world=2)
    assert list(marks) == [1] and (marks[1].how, marks[1].world) == (how, 2)
    assert marks[1].clean == (how in ("returned", "exit 0"))


def test_the_mark_comes_before_what_the_exit_runs(tmp_path: Path) -> None:
    """An atexit handler (a teardown) and a thread the interpreter joins both run after the mark."""
    code = ("import atexit, json, os, threading, time\n"
            "d = os.path.join(os.environ['TORCHHPC_JOB_DIR'], 'ended')\n"
            "def late(): open(os.path.join(os.environ['TORCHHPC_JOB_DIR'], 'seen'), 'w').write(str(os.listdir(d)))\n"
            "atexit.register(late)\n"
            "threading.Thread(target=time.sleep, args=(0.5,)).start()\n")
    assert list(ended_by(tmp_path, code)) == [0]
    assert (tmp_path / "seen").read_text() == "['rank-0']"


def test_a_process_the_rank_started_marks_nothing(tmp_path: Path) -> None:
    """A spawned multiprocessing worker inherits RANK; only the rank itself marks (after its worker ended)."""
    code = ("import multiprocessing as mp, os, time\n"
            "def work(): pass\n"
            "if __name__ == '__main__':\n"
            "    p = mp.get_context('spawn').Process(target=work); p.start(); p.join()\n"
            "    d = os.path.join(os.environ['TORCHHPC_JOB_DIR'], 'ended')\n"
            "    assert not os.path.isdir(d), os.listdir(d)\n")
    marks = ended_by(tmp_path, code)
    assert list(marks) == [0] and marks[0].how == "returned"


def test_no_mark_without_a_rank_or_a_job_dir(tmp_path: Path) -> None:
    assert ended_by(tmp_path, "pass", TORCHHPC_EXIT_CURE="0") == {}
    env = {"RANK": "0", "WORLD_SIZE": "1"}
    assert boot.ended(env) is False  # no job directory: nowhere to mark


def mark(tmp_path: Path, rank: int, world: int, t: float, how: str = "returned") -> None:
    d = tmp_path / exits.ENDED_DIR
    d.mkdir(exist_ok=True)
    (d / f"rank-{rank}").write_text(json.dumps({"rank": rank, "world": world, "time": t, "how": how, "pid": 1}))


def test_all_returned_needs_every_rank_and_a_clean_end(tmp_path: Path) -> None:
    mark(tmp_path, 0, 2, 100.0)
    assert not exits.all_returned(exits.read(str(tmp_path)))
    mark(tmp_path, 1, 2, 101.0, "raised RuntimeError")
    assert not exits.all_returned(exits.read(str(tmp_path)))
    mark(tmp_path, 1, 2, 101.0)
    marks = exits.read(str(tmp_path))
    assert exits.all_returned(marks) and exits.grace_left(marks, 15.0, 110.0) == 6.0
    assert exits.read(str(tmp_path), since=100.5) == {1: marks[1]}  # an earlier attempt's marks are not this one's
    exits.clear(str(tmp_path))
    assert exits.read(str(tmp_path)) == {}


TEARDOWN = (("destroy_process_group", "/v/site-packages/torch/distributed/distributed_c10d.py", 2080),
            ("main", "/home/u/train.py", 90))


def watch_of(tmp_path: Path, stacks: list[RankStack], monkeypatch: pytest.MonkeyPatch) -> tuple[Any, list[str], list[str], float]:
    ranks = tmp_path / "ranks"
    ranks.mkdir(exist_ok=True)
    (ranks / "rank-0@n1.log").write_text("FINISHED at=20\n")
    acted: list[str] = []
    said: list[str] = []
    monkeypatch.setattr(hang, "probe_job", lambda *a, **k: stacks)
    monkeypatch.setattr(hang, "with_flight", lambda v, _d, wait=5.0: v)
    watch = hang.HangWatch({}, 15.0, "restart", str(ranks), str(tmp_path), lambda: None, acted.append, said.append)
    return watch, acted, said, (ranks / "rank-0@n1.log").stat().st_mtime


def test_every_rank_returned_then_a_quiet_exit_completes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The resume-idiom failure: FINISHED printed, then 15 s quiet at exit, and the watch ended the job as a
    hang with "stacks not read: 10: main". With both marks, it waits out the grace, then finishes."""
    stacks = [RankStack(1, "n1", 11, 0.0, TEARDOWN)]
    watch, acted, said, t = watch_of(tmp_path, stacks, monkeypatch)
    mark(tmp_path, 0, 2, t)
    mark(tmp_path, 1, 2, t + 1)
    assert watch.check("RUNNING", now=t + 15) is None and not acted  # quiet 15 s, the last return only 14 s ago
    v = watch.check("RUNNING", now=t + 16)
    assert v is not None and acted == ["finish"] and v.culprits == () and not os.path.exists(tmp_path / HANG)
    assert v.at_exit == ("rank 1 stopped 15 s after its program ended: destroy_process_group (distributed_c10d.py:2080)",)
    assert said[0] == f"torchhpc: hang at exit: {v.at_exit[0]}"


def test_a_rank_gone_or_busy_in_its_exit_is_no_hang_at_exit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run 26 of the suite (load 10): both ranks returned, the grace (the hang timeout) passed, and they were
    called hung at exit while py-spy found them gone; the job had only been exiting slowly. A rank gone while
    its stack was read is no hang, nor one using CPU in the sample, until EXIT_GRACE_S more have passed."""
    stacks = [RankStack(0, "n1", 10, 0.0, (), EXITED), RankStack(1, "n1", 11, 0.8, TEARDOWN)]
    watch, acted, said, t = watch_of(tmp_path, stacks, monkeypatch)
    mark(tmp_path, 0, 2, t)
    mark(tmp_path, 1, 2, t)
    assert watch.check("RUNNING", now=t + 20) is None and not acted and not said
    watch._next_probe = 0.0
    v = watch.check("RUNNING", now=t + 15 + hang.EXIT_GRACE_S)
    assert v is not None and acted == ["finish"], said
    assert v.at_exit == (f"rank 1 stopped {15 + hang.EXIT_GRACE_S:.0f} s after its program ended: destroy_process_group "
                         "(distributed_c10d.py:2080)",)


@pytest.mark.parametrize("last", [None, "raised RuntimeError"])
def test_a_rank_that_did_not_return_cleanly_leaves_the_hang_watch_as_it_was(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, last: str | None) -> None:
    stacks = [RankStack(1, "n1", 11, 0.0, (("load_batch", "/home/u/train.py", 12),))]
    watch, acted, _said, t = watch_of(tmp_path, stacks, monkeypatch)
    mark(tmp_path, 0, 2, t)
    if last:  # its program ended, by an exception: an exit (its grace), never a completion
        mark(tmp_path, 1, 2, t, last)
        assert watch.check("RUNNING", now=t + 40) is None and not acted
        watch._next_probe = 0.0
    v = watch.check("RUNNING", now=t + 15 + hang.EXIT_GRACE_S + 1 if last else t + 40)
    assert v is not None and acted == ["restart"] and v.at_exit == () and v.culprits == (1,)


def test_the_batch_supervisor_completes_an_attempt_whose_rank_hangs_at_exit(tmp_path: Path) -> None:
    """The in-allocation supervisor's watch (supervisor/loop.py, as in the resume-idiom test on Slurm): the
    rank's program returned, then it blocks in an atexit handler. The attempt ends a success, its detail the
    hang-at-exit line. A real rank process with the real boot; no scheduler is stood in for (the local one)."""
    from torchhpc.supervisor.attempts import load_attempts
    from torchhpc.supervisor.loop import Options, Supervisor

    code = "import atexit, time\\ndef late():\\n    time.sleep(120)\\natexit.register(late)\\nprint(1)"
    run = new_run_id()  # its own: a run id shared with a concurrent test's ranks adds suspects
    step = (f"() {{ RANK=0 WORLD_SIZE=1 TORCHELASTIC_RUN_ID={run} TORCHHPC_JOB_DIR={tmp_path} "
            f"PYTHONPATH={boot_pythonpath(dict(os.environ))} exec {sys.executable} -c $'{code}'; }}")
    env = {"PATH": os.environ["PATH"], "BASH_FUNC__torchhpc_step%%": step, "TORCHELASTIC_RUN_ID": run}
    opts = Options(job_dir=str(tmp_path), nodes=1, nproc_per_node=1, launcher="srun", hang_timeout=0.5,
                   probe_every=60.0, scheduler="local")
    assert Supervisor(opts, env=env).run() == 0
    [attempt] = load_attempts(str(tmp_path))
    assert attempt["class"] is None, attempt
    # where in the program py-spy found it: late() as a rule; at load its sample can land in the interpreter's
    # finalization, which py-spy shows as the module's first line (seen side by side with the quick tier)
    assert attempt["detail"].startswith("rank 0 stopped ") and "after its program ended: " in attempt["detail"], attempt
    assert "late (<string>:3)" in attempt["detail"] or "<module> (<string>:" in attempt["detail"], attempt


def test_a_rank_in_its_teardown_gets_the_exit_grace_even_without_a_stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """py-spy read no stack ("10: main") of ranks that had printed FINISHED and called destroy_process_group:
    the boot's teardown mark (or a rank's return mark) tells the watch they are ending, not hung."""
    late = "py-spy read no stack: Error: Failed to copy PyThreadState"
    stacks = [RankStack(0, "n1", 10, 0.0, (), late), RankStack(1, "n1", 11, 0.0, (), late)]
    watch, acted, said, t = watch_of(tmp_path, stacks, monkeypatch)
    (tmp_path / exits.ENDED_DIR).mkdir()
    (tmp_path / exits.ENDED_DIR / "rank-0.teardown").write_text(f"{t}\n")
    mark(tmp_path, 1, 2, t)
    assert exits.in_teardown(str(tmp_path)) == {0}
    assert watch.check("RUNNING", now=t + 20) is None and not acted
    assert said == ["torchhpc: hang: ranks 0-1 quiet for 20s in their exit: not a hang yet (up to 90 s more)"]


def test_the_boot_marks_the_teardown_of_the_default_group_only(tmp_path: Path) -> None:
    code = ("import sys, types\n"
            "m = types.ModuleType('torch.distributed'); calls = []\n"
            "m.destroy_process_group = lambda group=None: calls.append(group)\n"
            "boot = sys.modules['_torchhpc_boot']\n"
            "boot.cure(m)\n"
            "m.destroy_process_group('pair')\n"
            "import os; d = os.path.join(os.environ['TORCHHPC_JOB_DIR'], 'ended')\n"
            "assert not os.path.exists(os.path.join(d, 'rank-0.teardown'))\n"
            "m.destroy_process_group()\n"
            "assert os.path.exists(os.path.join(d, 'rank-0.teardown')) and calls == ['pair', None], calls\n"
            "open(os.path.join(os.environ['TORCHHPC_JOB_DIR'], 'ok'), 'w').close()\n")
    ended_by(tmp_path, code, TORCHHPC_FLIGHT_RECORDER="off", TORCHHPC_DESTROY_TIMEOUT="0")
    assert (tmp_path / "ok").exists() and exits.in_teardown(str(tmp_path)) == {0}
