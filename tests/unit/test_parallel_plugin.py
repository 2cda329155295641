"""The side-by-side plugin's own locks (tests/parallel.py): slots bound the heavy tests, writers go first.

Each lock object opens its own files, as each xdist worker does, so ``flock`` sees separate holders.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from tests.parallel import RunLock, Slots


def _enters(ctx_factory: object, entered: threading.Event, release: threading.Event) -> threading.Thread:
    def body() -> None:
        with ctx_factory():  # type: ignore[operator]
            entered.set()
            release.wait(10)

    t = threading.Thread(target=body, daemon=True)
    t.start()
    return t


def test_two_slots_hold_off_a_third_test_until_one_is_free(tmp_path: Path) -> None:
    events = [(threading.Event(), threading.Event()) for _ in range(3)]
    threads = [_enters(Slots(tmp_path, 2).take, *events[i]) for i in range(2)]
    assert all(e.wait(5) for e, _ in events[:2])
    third = _enters(Slots(tmp_path, 2).take, *events[2])
    assert not events[2][0].wait(0.5), "a third test started while two held both slots"
    events[0][1].set()  # the first test ends
    assert events[2][0].wait(5), "the freed slot was not taken"
    for _, release in events:
        release.set()
    for t in [*threads, third]:
        t.join(5)


def test_a_test_wanting_every_slot_goes_before_new_single_ones(tmp_path: Path) -> None:
    one_in, one_out = threading.Event(), threading.Event()
    first = _enters(Slots(tmp_path, 2).take, one_in, one_out)
    assert one_in.wait(5)
    all_in, all_out = threading.Event(), threading.Event()
    whole = _enters(lambda: Slots(tmp_path, 2).take(2), all_in, all_out)
    time.sleep(0.3)  # it holds the free slot and waits for the other
    late_in, late_out = threading.Event(), threading.Event()
    late = _enters(Slots(tmp_path, 2).take, late_in, late_out)
    assert not all_in.wait(0.3) and not late_in.wait(0.3), "a slot was taken from under a test wanting both"
    one_out.set()
    assert all_in.wait(5) and not late_in.wait(0.3)
    all_out.set()
    assert late_in.wait(5)
    late_out.set()
    for t in (first, whole, late):
        t.join(5)


def test_a_second_test_wanting_several_slots_waits_holding_none(tmp_path: Path) -> None:
    """Run G: the matrix sat on one slot and the turnstile while the doc commands held two of three."""
    first_in, first_out = threading.Event(), threading.Event()
    first = _enters(lambda: Slots(tmp_path, 3).take(2), first_in, first_out)
    assert first_in.wait(5)
    second_in, second_out = threading.Event(), threading.Event()
    second = _enters(lambda: Slots(tmp_path, 3).take(2), second_in, second_out)
    time.sleep(0.3)
    single_in, single_out = threading.Event(), threading.Event()
    single = _enters(Slots(tmp_path, 3).take, single_in, single_out)
    assert single_in.wait(5), "a single test could not take the free slot while a second big one waited"
    assert not second_in.is_set()
    single_out.set()
    first_out.set()
    assert second_in.wait(5)
    second_out.set()
    for t in (first, second, single):
        t.join(5)


class _Clock:
    """The machine's clock as the spare slot reads it: ``busy`` cores kept busy since the last reading."""

    def __init__(self, busy: float) -> None:
        self.now, self.cpu, self.busy = 0.0, 0.0, busy

    def __call__(self) -> tuple[float, float]:
        self.now += 1.0  # each reading a second later
        self.cpu += self.busy
        return self.now, self.cpu


def test_the_spare_slot_goes_to_a_waiting_test_only_while_the_cores_stand_idle(tmp_path: Path) -> None:
    busy = _Clock(busy=2.0)  # both cores busy: the two slots' holders compute
    held = [(threading.Event(), threading.Event()) for _ in range(2)]
    threads = [_enters(Slots(tmp_path, 2, clock=busy, cores=2).take, *held[i]) for i in range(2)]
    assert all(e.wait(5) for e, _ in held)
    third_in, third_out = threading.Event(), threading.Event()
    slots = Slots(tmp_path, 2, clock=busy, cores=2)
    third = _enters(slots.take, third_in, third_out)
    assert not third_in.wait(1.0), "the spare was taken while the cores were busy"
    busy.busy = 0.5  # the holders now wait (a hang timeout): 1.5 cores idle
    assert third_in.wait(5), "the spare was not taken while the cores stood idle"
    assert slots.spare_held
    fourth_in, fourth_out = threading.Event(), threading.Event()
    fourth = _enters(Slots(tmp_path, 2, clock=busy, cores=2).take, fourth_in, fourth_out)
    assert not fourth_in.wait(1.0), "a second test took the one spare"
    third_out.set()
    assert fourth_in.wait(5), "the spare, given back, was not taken again"
    for _, release in [*held, (None, fourth_out)]:
        release.set()
    for t in [*threads, third, fourth]:
        t.join(5)
    assert not slots.spare_held


def test_several_slots_are_never_taken_from_the_spare(tmp_path: Path) -> None:
    idle = _Clock(busy=0.0)
    one_in, one_out = threading.Event(), threading.Event()
    first = _enters(Slots(tmp_path, 2, clock=idle, cores=2).take, one_in, one_out)
    assert one_in.wait(5)
    both_in, both_out = threading.Event(), threading.Event()
    both = _enters(lambda: Slots(tmp_path, 2, clock=idle, cores=2).take(2), both_in, both_out)
    assert not both_in.wait(1.0), "a test wanting both slots counted the spare as one"
    one_out.set()
    assert both_in.wait(5)
    both_out.set()
    for t in (first, both):
        t.join(5)


def test_a_waiting_writer_goes_before_new_readers(tmp_path: Path) -> None:
    reader, writer, late = RunLock(tmp_path), RunLock(tmp_path), RunLock(tmp_path)
    r_in, r_out = threading.Event(), threading.Event()
    first = _enters(reader.shared, r_in, r_out)
    assert r_in.wait(5)
    took: list[str] = []
    w = threading.Thread(target=lambda: (writer.take_exclusive(), took.append("writer")), daemon=True)
    w.start()
    time.sleep(0.3)  # the writer waits for the reader in flight, at the turnstile's far side
    l_in, l_out = threading.Event(), threading.Event()
    second = _enters(late.shared, l_in, l_out)
    assert not l_in.wait(0.5), "a new reader slipped past a waiting writer"
    r_out.set()
    w.join(5)
    assert took == ["writer"] and not l_in.is_set()
    writer.give_back()
    assert l_in.wait(5)
    l_out.set()
    for t in (first, second):
        t.join(5)


# -- the hand-out by expected seconds (tests/schedule.py) ------------------------------------------------------


class _Config:
    """What xdist's scheduler reads of pytest's config: the workers (``--tx``) and the reorder switch."""

    def __init__(self, workers: int) -> None:
        self.option = type("Option", (), {"loadscopereorder": False})()
        self._workers = workers

    def getvalue(self, name: str) -> list[str]:
        assert name == "tx"
        return [f"{self._workers}*popen"]


class _Worker:
    """An xdist worker as the scheduler sees it: the tests it was sent, and shutdown."""

    def __init__(self, name: str) -> None:
        self.name, self.sent, self.shutting_down = name, [], False
        self.gateway = type("Gateway", (), {"id": name})()

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.extend(indices)

    def shutdown(self) -> None:
        self.shutting_down = True


def _scheduler(collection: list[str], durations: dict[str, float], workers: int = 2) -> tuple[object, list[_Worker]]:
    from tests.schedule import TimedGroupScheduling

    sched = TimedGroupScheduling(_Config(workers), durations=durations)  # type: ignore[arg-type]
    nodes = [_Worker(f"gw{i}") for i in range(workers)]
    for node in nodes:
        sched.add_node(node)
        sched.add_node_collection(node, collection)
    sched.schedule()
    return sched, nodes


def _names(collection: list[str], node: _Worker) -> list[str]:
    return [collection[i] for i in node.sent]


def _finish(sched: object, collection: list[str], node: _Worker, nodeid: str) -> None:
    sched.mark_test_complete(node, collection.index(nodeid))  # type: ignore[attr-defined]


def test_a_long_last_test_gets_a_filler_and_the_next_long_group_waits_for_a_free_worker() -> None:
    """Run D's tail: a worker about to run the 5-minute doc commands was handed a 7-minute group behind them."""
    collection = ["i/docs.py::t@docs", "i/res.py::a@res", "i/res.py::b@res", "i/arr.py::c@arr", "u/x.py::u1", "u/x.py::u2"]
    durations = {"i/docs.py::t": 300.0, "i/res.py::a": 200.0, "i/res.py::b": 200.0, "i/arr.py::c": 60.0}
    sched, (one, two) = _scheduler(collection, durations)
    # the first worker: the doc commands, then a unit test behind them (not the 400-second group)
    assert _names(collection, one) == ["i/docs.py::t@docs", "u/x.py::u1"]
    # the second: the long group, whose first test knows its next; nothing more until it runs low
    assert _names(collection, two) == ["i/res.py::a@res", "i/res.py::b@res"]
    _finish(sched, collection, two, "i/res.py::a@res")  # its last test is long: a filler
    assert _names(collection, two)[2:] == ["u/x.py::u2"]
    _finish(sched, collection, one, "i/docs.py::t@docs")  # its last test is the short filler: the next group
    assert _names(collection, one)[2:] == ["i/arr.py::c@arr"]
    assert not one.shutting_down and not two.shutting_down


def test_without_fillers_the_queue_order_stands_and_workers_end_when_it_is_empty() -> None:
    collection = ["i/a.py::t@a", "i/b.py::t@b", "i/c.py::t@c"]
    durations = {"i/a.py::t": 100.0, "i/b.py::t": 90.0, "i/c.py::t": 80.0}
    _, (one, two) = _scheduler(collection, durations)
    assert _names(collection, one) == ["i/a.py::t@a", "i/c.py::t@c"]  # no unit short enough: the head
    assert _names(collection, two) == ["i/b.py::t@b"]
    assert two.shutting_down and one.shutting_down  # the queue is empty: each runs what it holds and ends


def test_estimates_strip_the_group_and_default_by_kind(tmp_path: Path) -> None:
    from tests.schedule import estimate, load_durations, plain_id

    assert plain_id("tests/x.py::t[a@b]") == "tests/x.py::t[a@b]"  # an @ inside a parameter id stays
    assert plain_id("tests/x.py::t[a@b]@grp") == "tests/x.py::t[a@b]"
    assert estimate("tests/integration/x.py::t@g", {}) == 5.0 and estimate("tests/unit/x.py::t", {}) == 0.2
    assert estimate("tests/unit/x.py::t", {"tests/unit/x.py::t": 7.5}) == 7.5
    bad = tmp_path / "durations.json"
    bad.write_text("{not json")
    assert load_durations(bad) == {} and load_durations(tmp_path / "missing.json") == {}


def test_a_test_measured_below_half_a_core_waits_and_an_unmeasured_one_does_not(tmp_path: Path) -> None:
    from tests.schedule import WAITING_CORES, load_cores, waits

    cores = {"tests/integration/x.py::hang": 0.1, "tests/integration/x.py::train": 1.6,
             "tests/integration/x.py::edge": WAITING_CORES}
    assert waits("tests/integration/x.py::hang@x", cores)  # xdist's @group does not hide it
    assert not waits("tests/integration/x.py::train@x", cores) and not waits("tests/integration/x.py::edge", cores)
    assert not waits("tests/integration/x.py::new_test", cores)  # not measured yet: it takes a slot
    good = tmp_path / "durations.json"
    good.write_text('{"tests": {}, "cores": {"a::b": 0.25}}')
    assert load_cores(good) == {"a::b": 0.25}
    good.write_text('{"tests": {}}')  # a file from before the cores were measured
    assert load_cores(good) == {} and load_cores(tmp_path / "missing.json") == {}
    shipped = load_cores()  # the committed file measures the suite's long tests
    assert len(shipped) > 100 and any(v < WAITING_CORES for v in shipped.values())


class _Item:
    """What tests.parallel reads of a pytest item: its node id, its fixtures' names, its marks."""

    def __init__(self, nodeid: str, fixtures: tuple[str, ...], marks: tuple[str, ...] = ()) -> None:
        self.nodeid, self.fixturenames, self._marks = nodeid, fixtures, marks

    def get_closest_marker(self, name: str) -> object:
        return name if name in self._marks else None


def test_a_test_on_a_cluster_of_its_modules_own_takes_no_lock_unless_it_also_reads_the_shared_one() -> None:
    from tests.parallel import on_cluster

    i = "tests/integration/test_x.py::t"
    assert on_cluster(_Item(i, ("slurm_cluster",)))  # type: ignore[arg-type]
    assert not on_cluster(_Item(i, ("own_cluster", "own_slurm"), ("cluster",)))  # type: ignore[arg-type]
    # a reference run on the shared cluster, the fault on its own: a reader of the shared one
    assert on_cluster(_Item(i, ("own_cluster", "slurm_cluster"), ("cluster",)))  # type: ignore[arg-type]
    assert not on_cluster(_Item("tests/unit/test_x.py::t", ("slurm",)))  # type: ignore[arg-type]
