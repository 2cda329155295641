"""Handing out groups by their expected seconds, not their count of tests (a pytest-xdist scheduler).

xdist's ``loadgroup`` gives a worker its next group as soon as two tests or fewer are left in the
ones it holds: tests counted, not seconds. In run D (docs/testing.md) a worker about to run the
5-minute doc commands was handed two more groups behind them, one of them test_resilience's 7 minutes,
and the other three workers sat idle for the run's last 12 minutes while it worked through them.

Here a worker gets new work only when its last test is waiting for a next one (an xdist worker runs a
test once it knows which comes after it, for the fixtures' teardown). If that last test is long, the
worker gets the shortest unit left (a unit test of a fraction of a second) to stand behind it, and the
long groups stay in the queue for whichever worker is free first. Expected seconds come from
tests/durations.json, one full run's wall time per test (``scripts/test_times.py --write-durations``).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from xdist.scheduler import LoadGroupScheduling

DURATIONS = Path(__file__).with_name("durations.json")
LONG_S = 20.0  # a last test this long gets a filler behind it, not the next group
FILLER_S = 3.0  # the longest unit that may wait behind a long test
UNKNOWN_S = {"tests/integration/": 5.0}  # a test the durations file does not list; else 0.2 s
DEFAULT_S = 0.2
# A test that kept fewer cores than this busy on average, run alone, mostly waits (on a node declared dead,
# a hang timeout, a time limit): it takes no slot (tests/parallel.py). Run I's CPUs were half idle for
# 3.5 minutes while four such tests held the three slots and the fourth worker waited for one.
WAITING_CORES = 0.5


def busy_seconds() -> float:
    """CPU seconds the machine has been busy since boot (all cores; idle and iowait excluded): /proc/stat, so every
    process counts, the dev cluster's ranks included."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0.0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields) - idle) / os.sysconf("SC_CLK_TCK")


def machine_clock() -> tuple[float, float]:
    """(now, the machine's busy CPU seconds): two readings give the cores it kept busy in between."""
    return time.monotonic(), busy_seconds()


def _section(path: Path, key: str) -> dict[str, float]:
    """One map of the durations file (``tests``: seconds; ``cores``: cores kept busy); empty when missing or bad."""
    try:
        data = json.loads(path.read_text())
        return {str(k): float(v) for k, v in data[key].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def load_durations(path: Path = DURATIONS) -> dict[str, float]:
    """Seconds per test node id; an empty map (every test its default) when the file is missing or bad."""
    return _section(path, "tests")


def load_cores(path: Path = DURATIONS) -> dict[str, float]:
    """Cores each test kept busy on average, run alone; empty when missing or bad (every test takes a slot)."""
    return _section(path, "cores")


def waits(nodeid: str, cores: dict[str, float]) -> bool:
    """Whether the test mostly waits (measured below WAITING_CORES); an unmeasured test does not."""
    return cores.get(plain_id(nodeid), WAITING_CORES) < WAITING_CORES


def plain_id(nodeid: str) -> str:
    """A node id without the ``@group`` xdist appends (``@`` inside a parameter id stays)."""
    at = nodeid.rfind("@")
    return nodeid[:at] if at > nodeid.rfind("]") else nodeid


def estimate(nodeid: str, durations: dict[str, float]) -> float:
    base = plain_id(nodeid)
    if base in durations:
        return durations[base]
    return next((s for prefix, s in UNKNOWN_S.items() if base.startswith(prefix)), DEFAULT_S)


class TimedGroupScheduling(LoadGroupScheduling):  # type: ignore[misc]
    """``loadgroup`` with the queue's order kept, but a long last test gets a filler, not a group."""

    def __init__(self, config: Any, log: Any = None, durations: dict[str, float] | None = None) -> None:
        super().__init__(config, log)
        self.durations = load_durations() if durations is None else durations
        self._cost: dict[str, float] = {}

    def cost(self, scope: str) -> float:
        """A queued unit's expected seconds (the sum of its tests)."""
        if scope not in self._cost:
            self._cost[scope] = sum(estimate(n, self.durations) for n in self.workqueue[scope])
        return self._cost[scope]

    def _pending(self, node: Any) -> list[str]:
        return [n for unit in self.assigned_work.get(node, {}).values() for n, done in unit.items() if not done]

    def choose(self, pending: list[str]) -> str:
        """The scope to give a worker whose tests still to run are ``pending``."""
        head = next(iter(self.workqueue))
        if sum(estimate(n, self.durations) for n in pending) < LONG_S:
            return head
        filler = min(self.workqueue, key=self.cost)
        return filler if self.cost(filler) <= FILLER_S else head

    def _assign_work_unit(self, node: Any) -> None:
        scope = self.choose(self._pending(node))
        work_unit = self.workqueue.pop(scope)
        self.assigned_work.setdefault(node, {})[scope] = work_unit
        collection = self.registered_collections[node]
        node.send_runtest_some([collection.index(n) for n, done in work_unit.items() if not done])

    def _reschedule(self, node: Any) -> None:
        if node.shutting_down:
            return
        if not self.workqueue:
            node.shutdown()
            return
        if len(self._pending(node)) > 1:  # it still knows its next test: nothing to hand out yet
            return
        self._assign_work_unit(node)
