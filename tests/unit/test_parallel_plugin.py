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
