"""The hang watch's pure parts: py-spy's dump format, the culprit rule, quietness from log files.

The py-spy text below is the format py-spy 0.4 prints for `py-spy dump --pid` (recorded from a
real dump of a rank waiting in all_reduce on the dev cluster, paths replaced).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from torchhpc.diagnose.hang import quiet_for
from torchhpc.diagnose.hang_verdict import culprit, exiting, in_collective, render, user_frame
from torchhpc.diagnose.probe import RankStack, parse_py_spy

WAITING = """Process 4242: /opt/venv/bin/python planted_hang.py 3
Python v3.11.7 (/usr/bin/python3.11)

Thread 4242 (idle): "MainThread"
    all_reduce (torch/distributed/distributed_c10d.py:3252)
    wrapper (torch/distributed/c10d_logger.py:83)
    <module> (planted_hang.py:18)
Thread 4250 (idle): "pt_gloo_runloop"
    run (threading.py:982)
"""
SLEEPING = """Process 4243: /opt/venv/bin/python planted_hang.py 3
Python v3.11.7 (/usr/bin/python3.11)

Thread 4243 (idle): "MainThread"
    <module> (planted_hang.py:16)
"""


def test_py_spy_main_thread_frames_innermost_first() -> None:
    frames = parse_py_spy(WAITING)
    assert frames[0] == ("all_reduce", "torch/distributed/distributed_c10d.py", 3252)
    assert frames[-1] == ("<module>", "planted_hang.py", 18)
    assert all(fn != "run" for fn, _p, _l in frames)  # other threads are not the rank's stack


def test_culprit_is_the_rank_outside_a_collective() -> None:
    stacks = [RankStack(r, "node1" if r < 2 else "node2", 100 + r, 0.0, parse_py_spy(WAITING)) for r in range(3)]
    stacks.append(RankStack(3, "node2", 103, 0.0, parse_py_spy(SLEEPING)))
    assert in_collective(stacks[0].frames) and not in_collective(stacks[3].frames)
    v = culprit(stacks)
    assert v.culprits == (3,) and v.waiting == (0, 1, 2)
    text = "\n".join(render(v, 21.0))
    assert "rank 3 on node2 is not in a collective: <module> at planted_hang.py:16" in text
    assert "ranks 0-2 wait in all_reduce" in text
    one = "\n".join(render(culprit([stacks[0], stacks[3]]), 21.0))
    assert "hang: rank 0 waits in all_reduce" in one, one  # not "ranks 0 wait"


def test_every_rank_in_a_collective_says_so() -> None:
    v = culprit([RankStack(r, "n", r, 0.0, parse_py_spy(WAITING)) for r in range(2)])
    assert v.culprits == () and "every rank waits in a collective" in v.note


def test_no_stack_says_why() -> None:
    v = culprit([RankStack(0, "n", 1, 0.0, (), "py-spy is not installed here (pip install py-spy)")])
    # no stack, no culprit: naming rank 0 would be a guess (issue 51, item 5)
    assert v.culprits == () and v.note == "stacks not read: py-spy is not installed here (pip install py-spy)"
    assert not any("is not in a collective" in line for line in render(v, 30.0))


def test_user_frame_skips_installed_packages() -> None:
    frames = (("wait", "/opt/venv/lib/python3.11/site-packages/torch/x.py", 1), ("train", "/home/u/t.py", 9))
    assert user_frame(frames) == "/home/u/t.py:9"


def test_quiet_for_reads_the_newest_rank_file(tmp_path: Path) -> None:
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    now = time.time()
    for r, age in ((0, 50), (1, 30)):
        f = ranks / f"rank-{r}@node1.log"
        f.write_text("x\n")
        os.utime(f, (now - age, now - age))
    q = quiet_for(str(ranks), now)
    assert q is not None and 29 <= q <= 31
    out = tmp_path / "job.out"
    out.write_text("x\n")
    os.utime(out, (now - 7, now - 7))
    q2 = quiet_for(str(tmp_path / "none"), now, str(out))
    assert q2 is not None and 6 <= q2 <= 8


def _watch_with(tmp_path: Path, stacks: list[RankStack]) -> tuple[Any, list[str], list[str], float]:
    from torchhpc.diagnose import hang

    ranks = tmp_path / "ranks"
    ranks.mkdir(exist_ok=True)
    (ranks / "rank-0@n1.log").write_text("FINISHED at=20\n")
    acted: list[str] = []
    said: list[str] = []
    watch = hang.HangWatch({}, 15.0, "restart", str(ranks), str(tmp_path), lambda: None, acted.append, said.append)
    hang.probe_job = lambda *a, **k: stacks  # type: ignore[assignment]
    return watch, acted, said, (ranks / "rank-0@n1.log").stat().st_mtime


TEARDOWN = (("destroy_process_group", "/v/site-packages/torch/distributed/distributed_c10d.py", 2080),
            ("_destroy_dist_connection", "/v/site-packages/lightning/fabric/utilities/distributed.py", 300),
            ("teardown", "/v/site-packages/lightning/pytorch/strategies/ddp.py", 420))
JOINING = (("_shutdown", "/usr/lib/python3.11/threading.py", 1590),)


def test_a_quiet_exit_is_not_a_hang_until_its_grace_is_spent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 51, item 10: under load a rank's exit after Lightning's teardown stayed quiet and idle for 46 s
    and the watch (--hang-timeout 15) ended a run that had finished."""
    from torchhpc.diagnose import hang

    monkeypatch.setattr(hang, "probe_job", hang.probe_job)
    monkeypatch.setattr(hang, "with_flight", lambda v, _d, wait=5.0: v)
    stacks = [RankStack(0, "n1", 10, 0.0, TEARDOWN), RankStack(1, "n1", 11, 0.0, JOINING)]
    assert exiting(TEARDOWN) and exiting(JOINING) and not exiting(parse_py_spy(SLEEPING))
    watch, acted, said, t = _watch_with(tmp_path, stacks)
    assert watch.check("RUNNING", now=t + 46) is None and not acted and not watch.fired
    assert said == ["torchhpc: hang: ranks 0-1 quiet for 46s in their exit: not a hang yet (up to 90 s more)"]
    watch._next_probe = 0.0
    assert watch.check("RUNNING", now=t + 15 + hang.EXIT_GRACE_S + 1) is not None and acted == ["restart"]


def test_an_exiting_rank_others_wait_for_is_no_excuse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One rank left the loop early and sits in destroy_process_group; the others wait in all_reduce for it."""
    from torchhpc.diagnose import hang

    monkeypatch.setattr(hang, "probe_job", hang.probe_job)
    monkeypatch.setattr(hang, "with_flight", lambda v, _d, wait=5.0: v)
    stacks = [RankStack(0, "n1", 10, 0.0, TEARDOWN), RankStack(1, "n1", 11, 0.0, parse_py_spy(WAITING))]
    watch, acted, _said, t = _watch_with(tmp_path, stacks)
    assert watch.check("RUNNING", now=t + 16) is not None and acted == ["restart"]


# A warm client (boot/warm.py) waiting for its standby to fork the rank: py-spy 0.4's frames, from a dump taken
# while the standby imported torch (paths replaced).
CLIENT = (("readinto", "/usr/lib/python3.11/socket.py", 706), ("client", "/v/torchhpc/boot/warm.py", 99),
          ("main", "/v/torchhpc/boot/warm.py", 356), ("<module>", "/v/torchhpc/boot/warm.py", 377))


def test_ranks_whose_standby_has_not_forked_them_are_starting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CI of stop 74: at load 30 a standby importing torch kept four warm clients quiet and idle past the hang
    timeout; the watch named rank 3 hung "in socket.py:706" and cancelled a run that had not started yet."""
    from torchhpc.diagnose import hang
    from torchhpc.diagnose.hang_verdict import starting

    monkeypatch.setattr(hang, "probe_job", hang.probe_job)
    monkeypatch.setattr(hang, "with_flight", lambda v, _d, wait=5.0: v)
    assert starting(CLIENT) and not starting(parse_py_spy(SLEEPING)) and not starting(parse_py_spy(WAITING))
    stacks = [RankStack(r, "n1", 10 + r, 0.0, CLIENT) for r in range(4)]
    watch, acted, _said, t = _watch_with(tmp_path, stacks)
    assert watch.check("RUNNING", now=t + 40) is None and not acted and not watch.fired
    stacks[:] = [RankStack(r, "n1", 10 + r, 0.0, parse_py_spy(WAITING)) for r in range(3)]
    stacks.append(RankStack(3, "n1", 13, 0.0, parse_py_spy(SLEEPING)))
    watch._next_probe = 0.0
    v = watch.check("RUNNING", now=t + 60)
    assert v is not None and v.culprits == (3,) and acted == ["restart"]
