"""Running the suite side by side (pytest-xdist), safely: groups, and a readers-writer lock.

Most integration tests only submit jobs and wait on them: two cores can wait on many at once
(issue 53). Some change what every other test relies on: they fail or degrade a node, change the
dev cluster's configuration or accounting, or hold every node. Those
are marked ``@pytest.mark.exclusive`` and run one at a time, with nothing else touching the cluster.

- **Groups** (``--dist loadgroup``): each integration module's cluster tests are one group and its
  local tests another, so a module fixture runs once per group, in one worker; every exclusive test joins the group ``exclusive`` (one worker, one at
  a time). Unit tests are spread one by one. Under ``--no-loadscope-reorder`` (what scripts/test.sh
  uses) the groups go out in the order :func:`pytest_collection_modifyitems` leaves them: the
  exclusive chain first, then what needs no lock and so runs beside it (the local integration
  modules and the tests on a cluster of their module's own, the longest first by their seconds in
  tests/durations.json, then the unit tests), then the
  cluster's modules, the longest first. tests/schedule.py hands them out by those seconds.
- **The lock**: a test that uses the dev cluster (its ``cluster`` mark or fixtures) holds a shared
  lock for its set-up, call and teardown; the exclusive chain holds it exclusively from its first
  test to its last (a lock per exclusive test let readers in between, and each exclusive test then
  waited for the longest test in flight: 25 such waits stretched the run by a third). Tests that do not
  use the cluster take no lock: they run beside the exclusive chain. Writers go first (a turnstile): once an exclusive test asks,
  no new test starts until it is done, so it waits for the tests in flight, never for a stream of
  new ones. Both are ``flock`` locks on files of this run, so a crashed worker releases its own.

- **Slots**: on two cores the integration tests are CPU-bound (every rank imports torch), and four
  of them at once ran slower than their own timeouts allow. A test that starts ranks (an integration
  or ``slow`` test, but neither the exclusive chain nor a test that mostly waits: see :func:`_heavy`) also
  holds one of ``TORCHHPC_TEST_SLOTS`` slots (default: the machine's cores + 1: most of them wait on jobs
  part of the time) for its set-up, call and teardown, always taken after the lock above (see
  :func:`pytest_runtest_protocol`). The unit tests take none: the workers beyond the slots run them, and
  the tests that wait. One **spare** slot more goes to a test that has waited for one while the cores stood
  idle (SPARE_IDLE_CORES, measured over SPARE_AFTER_S): the slots' holders were then waiting themselves.

Outside xdist (one process) no lock is taken and the order is left alone.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import pytest

from tests.schedule import estimate, load_cores, load_durations, machine_clock, waits

EXCLUSIVE = "exclusive"
WHOLE_MACHINE = "whole_machine"
SPARE_AFTER_S = 4.0  # a test waiting for a slot this long looks at how idle the cores were meanwhile
SPARE_IDLE_CORES = 0.8  # idle cores (on average, over that time) that let it take the spare slot

# Long modules without module fixtures: one group per test function (its parameters together), so
# that one module does not hold a worker for a quarter of the run.
SPLIT = {"tests/integration/test_diagnose_cluster.py", "tests/integration/test_examples_train.py",
         "tests/integration/test_docs_run.py", "tests/integration/test_exit_contract.py"}
# Modules whose parametrized cells are each a job of a minute: one group per cell, so that they spread over the
# workers and the slots (the compatibility matrix: one fixture running its 44 jobs at once held the machine for
# 14 minutes of the landing CI).
CELLS = {"tests/integration/test_compat_matrix.py"}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "exclusive: changes what other tests rely on (fails or degrades a node, changes the dev cluster's "
        "configuration or accounting, holds every node): runs alone under xdist",
    )
    config.addinivalue_line(
        "markers",
        "whole_machine: runs many jobs at once by itself (a matrix), or loads the machine on purpose (a soak): "
        "holds every slot but one under xdist",
    )


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` by expected seconds (tests/schedule.py); other modes are xdist's own."""
    if getattr(config.option, "dist", None) != "loadgroup":
        return None
    from tests.schedule import TimedGroupScheduling

    return TimedGroupScheduling(config, log)


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def _is_integration(item: pytest.Item) -> bool:
    return _module(item).startswith("tests/integration/")


def on_cluster(item: pytest.Item) -> bool:
    """Whether the test uses the shared dev cluster (its mark or its fixtures): only those take the lock. The
    fixtures live in tests/integration/conftest.py: elsewhere a name ``slurm`` is a parameter (unit tests of
    array syntax), and taking it for the fixture held three workers behind the exclusive chain for 4 minutes."""
    names = set(getattr(item, "fixturenames", ()))
    fixtures = {"slurm_cluster", "slurm"} & names
    if _is_integration(item) and "own_cluster" in names and not fixtures:
        return False  # a dev cluster of its module's own: the shared one's lock is not its business
    return bool(item.get_closest_marker("cluster")) or (_is_integration(item) and bool(fixtures))


@pytest.hookimpl(tryfirst=True)  # before xdist appends the group to each node id
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not _workers(config):
        return
    groups: dict[pytest.Item, str] = {}
    for item in items:
        if item.get_closest_marker(EXCLUSIVE):
            groups[item] = EXCLUSIVE
        elif _is_integration(item):  # a module's cluster tests and its local ones: two groups
            stem = _module(item).rsplit("/", 1)[-1].removesuffix(".py")
            if _module(item) in SPLIT:
                stem += "-" + getattr(item, "originalname", item.name)
            elif _module(item) in CELLS:
                stem += "-" + item.name.replace("[", ".").rstrip("]")  # no "]" after the "@" (schedule.plain_id)
            groups[item] = stem if on_cluster(item) else f"{stem}-local"
        if item in groups:
            item.add_marker(pytest.mark.xdist_group(groups[item]))
    # a group's expected seconds, from one full run (tests/durations.json), for the longest-first order
    durations = load_durations()
    cost: dict[str, float] = defaultdict(float)
    for item, group in groups.items():
        cost[group] += estimate(item.nodeid, durations)

    def rank(pair: tuple[int, pytest.Item]) -> tuple[int, int, float, int]:
        index, item = pair
        if item.get_closest_marker(EXCLUSIVE):
            return (0, 0, 0.0, index)  # the one chain that cannot overlap the cluster's other users: first
        if _module(item) in CELLS:  # CPU-heavy cells of a minute, one slot each: first on the cluster, while the
            return (1, 2, -cost[groups[item]], index)  # unit tests fill the workers beside (run 1: last, a 5-min tail)
        if not _is_integration(item):
            return (2, 0, 0.0, index)  # no lock either: the short unit tests fill that time's end
        # the local modules run beside the exclusive chain (no lock), the cluster's after it: the whole-machine
        # ones first, while the slots are still free, then the longest first
        whole = 0 if item.get_closest_marker(WHOLE_MACHINE) else 1
        return (1 if not on_cluster(item) else 3, whole, -cost[groups[item]], index)

    items[:] = [item for _, item in sorted(enumerate(items), key=rank)]


def pytest_collection_finish(session: pytest.Session) -> None:
    """Refuse to run when xdist's loadgroup did not take: the exclusive tests would then be spread over
    workers that wait on each other's lock until the run's timeout. pytest-xdist 3.8 groups by renaming
    ``Node._nodeid``, which pytest 9.2 no longer reads (its node ids live in ``Node._id``): hence the dev
    extra's ``pytest<9.2``."""
    config = session.config
    if not getattr(config.option, "loadgroup", False):
        return
    lost = [i.nodeid for i in session.items if i.get_closest_marker("xdist_group") and "@" not in i.nodeid]
    if lost:
        raise pytest.UsageError(
            f"pytest-xdist's --dist loadgroup did not group {len(lost)} tests (e.g. {lost[0]}) under pytest "
            f"{pytest.__version__}: install the dev extra's pytest (pip install -e '.[dev]')")


def _workers(config: pytest.Config) -> int:
    """How many xdist workers this run has (0: no xdist), in the controller and in each worker."""
    if hasattr(config, "workerinput"):
        return int(config.workerinput.get("workercount", 0))
    n = getattr(config.option, "numprocesses", None)
    return int(n) if isinstance(n, int) else 0


class RunLock:
    """A writer-preferring readers-writer lock shared by this run's workers (two ``flock`` files)."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._turnstile: IO[bytes] = open(directory / "turnstile.lock", "ab")
        self._rw: IO[bytes] = open(directory / "rw.lock", "ab")
        self.holding = False  # this worker holds the cluster alone

    @contextmanager
    def shared(self) -> Iterator[float]:
        start = time.monotonic()
        fcntl.flock(self._turnstile, fcntl.LOCK_EX)  # queue behind a writer that is waiting
        try:
            fcntl.flock(self._rw, fcntl.LOCK_SH)
        finally:
            fcntl.flock(self._turnstile, fcntl.LOCK_UN)
        try:
            yield time.monotonic() - start
        finally:
            fcntl.flock(self._rw, fcntl.LOCK_UN)

    def take_exclusive(self) -> float:
        """Hold the cluster alone (seconds waited); a no-op while this worker holds it already: a chain of
        exclusive tests keeps it from the first to the last, so that readers do not slip in between and
        each exclusive test waits again for the longest test in flight."""
        if self.holding:
            return 0.0
        start = time.monotonic()
        fcntl.flock(self._turnstile, fcntl.LOCK_EX)  # no new reader from now on
        fcntl.flock(self._rw, fcntl.LOCK_EX)  # the readers in flight finish
        self.holding = True
        return time.monotonic() - start

    def give_back(self) -> None:
        if self.holding:
            fcntl.flock(self._rw, fcntl.LOCK_UN)
            fcntl.flock(self._turnstile, fcntl.LOCK_UN)
            self.holding = False


class Slots:
    """At most ``count`` heavy tests at once across this run's workers: one ``flock`` file per slot, and a
    turnstile so that a test asking for several slots (``whole_machine``) gathers them before new tests
    take the ones it waits for."""

    def __init__(self, directory: Path, count: int, clock: Callable[[], tuple[float, float]] | None = None,
                 cores: int = 0) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._turnstile: IO[bytes] = open(directory / "slots-turnstile.lock", "ab")
        self._several: IO[bytes] = open(directory / "slots-several.lock", "ab")
        self._files: list[IO[bytes]] = [open(directory / f"slot-{i}.lock", "ab") for i in range(max(1, count))]
        # The spare: one more single test, taken only while the cores stand idle (``clock``: machine_clock).
        self._spare: IO[bytes] | None = open(directory / "slot-spare.lock", "ab") if clock else None
        self._clock, self._cores = clock, cores or os.cpu_count() or 2
        self.spare_held = False

    @property
    def all_but_one(self) -> int:
        """What a whole-machine test holds: every slot but one, so that one other test can still run
        (gathering all of them waited out the longest test in flight)."""
        return max(1, len(self._files) - 1)

    @contextmanager
    def take(self, wanted: int = 1) -> Iterator[float]:
        """Hold ``wanted`` slots (at most all of them); yields the seconds waited. Tests wanting several go one
        at a time, and wait for their turn holding none: in run G the compatibility matrix gathered slots
        while the doc commands held two, sat on the third and the turnstile, and nothing else could start
        for 3.5 minutes."""
        start, held = time.monotonic(), []
        wanted = min(max(1, wanted), len(self._files))
        several = wanted > 1
        window = self._clock() if self._clock and not several else None
        try:
            if several:
                fcntl.flock(self._several, fcntl.LOCK_EX)
            fcntl.flock(self._turnstile, fcntl.LOCK_EX)
            try:
                while len(held) < wanted:
                    for f in self._files:
                        if len(held) < wanted and f not in held and _took(f):
                            held.append(f)
                    if window and not held:
                        window = self._spare_if_idle(window, held)
                    if len(held) < wanted:
                        time.sleep(0.1)
                self.spare_held = bool(held) and held[0] is self._spare
            finally:
                fcntl.flock(self._turnstile, fcntl.LOCK_UN)
            yield time.monotonic() - start
        finally:
            for f in held:
                fcntl.flock(f, fcntl.LOCK_UN)
            if several:
                fcntl.flock(self._several, fcntl.LOCK_UN)
            self.spare_held = False

    def _spare_if_idle(self, window: tuple[float, float], held: list[IO[bytes]]) -> tuple[float, float]:
        """Take the spare slot into ``held`` when the machine left SPARE_IDLE_CORES idle over the last
        SPARE_AFTER_S (since ``window``, a clock reading); the next window's start. Runs 17 and 18 left the cores
        7-10 % idle in pytest, 30-48 % for minutes at a time, while workers waited for a slot: the tests holding
        the slots were waiting out hang timeouts and time limits."""
        assert self._clock is not None and self._spare is not None
        now, busy = self._clock()
        if now - window[0] < SPARE_AFTER_S:
            return window
        idle = self._cores - (busy - window[1]) / (now - window[0])
        if idle >= SPARE_IDLE_CORES and _took(self._spare):
            held.append(self._spare)
        return now, busy


def _took(f: IO[bytes]) -> bool:
    """Whether this worker now holds the ``flock`` of ``f`` (never waits)."""
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _slot_count() -> int:
    raw = os.environ.get("TORCHHPC_TEST_SLOTS", "")
    try:
        return max(1, int(raw)) if raw else (os.cpu_count() or 2) + 1
    except ValueError:
        raise pytest.UsageError(f"TORCHHPC_TEST_SLOTS={raw!r}: give a whole number of tests at once, e.g. 2") from None


_CORES: dict[str, float] | None = None


def _heavy(item: pytest.Item) -> bool:
    """Whether the test starts ranks or programs of its own (what the slots count). The exclusive chain takes
    no slot: it is the run's critical path (no cluster test starts while it runs), and it mostly waits, on
    a node declared dead or a job held pending. Nor does a test that mostly waits, measured alone
    (tests/durations.json's ``cores``, tests/schedule.py's WAITING_CORES): a hang timeout, a time limit."""
    global _CORES
    if item.get_closest_marker(EXCLUSIVE):
        return False
    if not (_is_integration(item) or item.get_closest_marker("slow")):
        return False
    if item.get_closest_marker(WHOLE_MACHINE):
        return True
    if _CORES is None:
        _CORES = load_cores()
    return not waits(item.nodeid, _CORES)


_SHARED: tuple[RunLock, Slots] | None = None


def _shared() -> tuple[RunLock, Slots] | None:
    """This run's lock and slots (files under the temporary folder, named after xdist's run id); None without xdist."""
    global _SHARED
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not run:
        return None
    if _SHARED is None:
        directory = Path(tempfile.gettempdir()) / f"torchhpc-tests-{run}"
        _SHARED = RunLock(directory), Slots(directory, _slot_count(), clock=machine_clock)
    return _SHARED


def _run_lock() -> RunLock | None:
    shared = _shared()
    return shared[0] if shared else None


def _run_slots() -> Slots | None:
    shared = _shared()
    return shared[1] if shared else None


@contextmanager
def _slot(item: pytest.Item) -> Iterator[None]:
    slots = _run_slots() if _heavy(item) else None
    if slots is None:
        yield
        return
    wanted = slots.all_but_one if item.get_closest_marker(WHOLE_MACHINE) else 1
    with slots.take(wanted) as waited:
        if waited > 5:
            item.user_properties.append(("slot_wait_s", round(waited, 1)))
        if slots.spare_held:
            item.user_properties.append(("spare_slot", 1))
        yield


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Any) -> Iterator[None]:
    """The run lock first, then a slot, always in that order: a test that held a slot while it waited
    for the lock would keep the exclusive chain, which holds the lock, from the slot it needs next."""
    exclusive = bool(item.get_closest_marker(EXCLUSIVE))
    lock = _run_lock() if (on_cluster(item) or exclusive) else None
    if lock is None:
        with _slot(item):
            yield
        if exclusive and on_cluster(item):
            nodes_back(item)
        return
    if not exclusive:
        with lock.shared() as waited:
            if waited > 5:
                item.user_properties.append(("lock_wait_s", round(waited, 1)))
            with _slot(item):
                yield
        return
    waited = lock.take_exclusive()
    if waited > 5:
        item.user_properties.append(("lock_wait_s", round(waited, 1)))
    try:
        if on_cluster(item):
            nodes_back(item, idle=True)  # the jobs of the tests before it may still be COMPLETING
        with _slot(item):
            yield
        if on_cluster(item):
            nodes_back(item)  # before the lock goes: the next test finds every node up
    finally:
        if nextitem is None or not nextitem.get_closest_marker(EXCLUSIVE):
            lock.give_back()  # the chain's last test


def nodes_back(item: pytest.Item, timeout: float = 120.0, idle: bool = False, state: Any = None) -> None:
    """Wait until every node of the dev cluster is up again after an exclusive test: a revived node is
    ``down*`` for seconds after its slurmd restarts, and a test started then saw three nodes of four.
    A node still down after ``timeout`` is resumed once and named on the terminal (the next tests
    would fail for it, not for themselves). ``idle``: before an exclusive test, also until no job
    holds a node (a test that takes every node found one still COMPLETING, and its job ran). ``state``: that
    cluster (a module's own, tests/integration/conftest.py), not the shared one."""
    import subprocess

    from tests.cluster_keeper import node_states
    from torchhpc.devcluster import load_state

    state = state or load_state()
    if state is None:
        return
    env, deadline, resumed = state.client_env(), time.monotonic() + timeout, False
    while True:
        shown = node_states(state)
        bad = sorted(n for n, t in shown.items()
                     if "*" in t or t.startswith(("down", "drain", "fail", "unk", "boot", "futr", "inval"))
                     or (idle and t != "idle"))
        if shown and not bad:
            return
        if time.monotonic() > deadline:
            if resumed:
                reporter = item.config.pluginmanager.get_plugin("terminalreporter")
                if reporter is not None:
                    reporter.write_line(f"{item.nodeid}: dev cluster nodes still not up: {', '.join(bad)}", red=True)
                return
            for node in bad:  # (a busy node refuses the resume, as it should)
                subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], env=env,
                               capture_output=True, timeout=30)
            deadline, resumed = time.monotonic() + 30, True
        time.sleep(0.5)

