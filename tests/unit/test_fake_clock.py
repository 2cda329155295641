"""Time logic on a fake clock (issue 53, item 4): what waits seconds in the system takes none here.

As submitit's tests fast-forward ``time.time``, these hand the code a clock they move by hand: the
hang watch's quiet time and its re-probe back-off, an attempt's start capping its quiet time, the
supervisor's attempt times. Elsewhere on a fake clock already: the end watch's back-off
(test_end_marker.py), the account's arithmetic (test_events.py), the exit grace (test_hang.py). The
real-time behaviour keeps one real test each (test_supervisor.py, tests/integration/test_resilience.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.unit.test_hang import SLEEPING, _watch_with
from torchhpc.core.exitcodes import EXIT_CODES
from torchhpc.diagnose.probe import RankStack, parse_py_spy
from torchhpc.supervisor import load_attempts
from torchhpc.supervisor.loop import Options, Supervisor


def test_the_hang_watch_fires_at_its_timeout_not_a_second_before(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from torchhpc.diagnose import hang

    monkeypatch.setattr(hang, "probe_job", hang.probe_job)
    monkeypatch.setattr(hang, "with_flight", lambda v, _d, wait=5.0: v)
    idle = [RankStack(0, "n1", 10, 0.0, parse_py_spy(SLEEPING))]
    watch, acted, _said, t = _watch_with(tmp_path, idle)  # --hang-timeout 15, the rank's last line at t
    assert watch.check("RUNNING", now=t + 14.9) is None and not acted
    assert watch.check("RUNNING", now=t + 15.0) is not None and acted == ["restart"]
    assert watch.quiet == pytest.approx(15.0, abs=0.01)
    assert watch.check("RUNNING", now=t + 100) is None and acted == ["restart"]  # it acts once


def test_a_busy_rank_puts_the_next_probe_off_by_the_back_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A quiet rank that still uses CPU is computing, not hung: the watch looks again after
    max(10 s, timeout / 2), not on every poll (each probe is a py-spy on every node)."""
    from torchhpc.diagnose import hang

    monkeypatch.setattr(hang, "probe_job", hang.probe_job)  # _watch_with replaces it: put it back after
    monkeypatch.setattr(hang, "with_flight", lambda v, _d, wait=5.0: v)
    probes: list[float] = []
    stacks = [RankStack(0, "n1", 10, 0.5, parse_py_spy(SLEEPING))]  # 0.5 CPU-s in the sample: busy
    watch, acted, _said, t = _watch_with(tmp_path, stacks)
    monkeypatch.setattr(hang, "probe_job", lambda *a, **k: probes.append(len(probes)) or stacks)
    for dt in (16, 20, 25.9):
        assert watch.check("RUNNING", now=t + dt) is None
    assert len(probes) == 1  # at t+16; the next is due at t+26
    assert watch.check("RUNNING", now=t + 26) is None and len(probes) == 2 and not acted


def test_an_attempts_start_caps_its_quiet_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The supervisor's restarted attempt is quiet since its own start at most, however old the last line."""
    from torchhpc.diagnose import hang

    monkeypatch.setattr(hang, "probe_job", hang.probe_job)
    monkeypatch.setattr(hang, "with_flight", lambda v, _d, wait=5.0: v)
    idle = [RankStack(0, "n1", 10, 0.0, parse_py_spy(SLEEPING))]
    watch, acted, _said, t = _watch_with(tmp_path, idle)
    assert watch.check("RUNNING", now=t + 500, started=t + 490) is None and not acted
    assert watch.check("RUNNING", now=t + 505, started=t + 490) is not None and acted == ["restart"]


def test_the_supervisor_stamps_each_attempt_with_its_clock(tmp_path: Path) -> None:
    """Two real (bash) attempts failing with a network error; every time in attempts.json is the
    injected clock's, so the account's arithmetic over them is exact."""
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    step = ("() { echo 'torch.distributed.DistNetworkError: x' >> " + str(ranks / "rank-0@localhost.log")
            + "; exit 1; }")
    env = {"PATH": os.environ["PATH"], "BASH_FUNC__torchhpc_step%%": step}
    ticks = iter(range(1000, 2000, 10))
    opts = Options(job_dir=str(tmp_path), nodes=1, nproc_per_node=1, launcher="srun", max_restarts=1,
                   probe_every=60.0, scheduler="local", max_no_progress=0)
    assert Supervisor(opts, env=env, clock=lambda: float(next(ticks))).run() == EXIT_CODES["network"]
    tries = load_attempts(str(tmp_path))
    assert [a["class"] for a in tries] == ["network", "network"], tries
    stamps = [(a["started"], a["ended"]) for a in tries]
    assert all(float(s) % 10 == 0 and float(e) % 10 == 0 and e > s for s, e in stamps), stamps
    assert stamps[1][0] >= stamps[0][1], stamps  # the second starts after the first ended
