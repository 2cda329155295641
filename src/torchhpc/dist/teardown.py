"""Leaving a gloo job without a C++ abort: wait for gloo's worker threads before Python shuts down.

The abort (``terminate called without an active exception``, SIGABRT after all work was
done) has this cause, taken from a backtrace of a rank that hit it (torch 2.13 CPU,
``tests/integration/test_examples_train.py`` under load):

* each gloo collective is an ``AsyncWork`` run by one of ``ProcessGroupGloo``'s
  ``pt_gloo_runloop`` threads; the thread completes the work's future (the rank's main
  thread moves on) and only then, at the end of its loop iteration, drops its own
  reference. For DDP's gradient all-reduce that is the last one, so the work is destroyed
  on the gloo thread;
* the work carries the ``at::ThreadLocalState`` of the thread that launched it, which
  holds Python objects (``c10::SafePyObject``); destroying them takes the GIL;
* on a loaded machine the gloo thread is descheduled between completing the future and
  dropping the work. The main thread meanwhile ends the script and enters
  ``Py_FinalizeEx``; when the gloo thread asks for the GIL, CPython ends it with
  ``pthread_exit`` (a thread may not run Python code during finalization), the forced
  unwind meets the ``noexcept`` destructor, and ``std::terminate`` aborts the process.

Seen 7 times in 30 two-rank runs of the docs' DDP script beside two busy loops. A
barrier does not close the window (it can run on the other gloo thread), and
``destroy_process_group()`` does not join the threads when DDP still holds the group.
What does: before Python finalizes, let the main thread sleep with the GIL released
until every gloo thread is asleep between works (the threads' state from ``/proc``), so
any pending destruction gets the GIL while it may. It costs a few ms at exit; where
``/proc`` is not there it does nothing.
"""

from __future__ import annotations

import atexit
from collections.abc import Callable

# One copy of the settle, in the stdlib-only boot file that also runs where torchhpc is not installed.
from torchhpc.boot.sitecustomize import GLOO_WORKER, gloo_workers_settle

__all__ = ["GLOO_WORKER", "before_teardown", "gloo_workers_settle", "run_before_teardown", "settle_at_exit"]

_REGISTERED = False
_BEFORE: list[Callable[[], None]] = []


def before_teardown(fn: Callable[[], None]) -> None:
    """Have :func:`torchhpc.dist.cleanup` call ``fn`` before it destroys the process group (once per fn).

    The checkpoint helper waits here for an asynchronous save in flight: its thread still
    talks over a process group that the teardown would pull from under it.
    """
    if fn not in _BEFORE:
        _BEFORE.append(fn)


def run_before_teardown() -> None:
    """Call what :func:`before_teardown` registered, in order; one that raises does not stop the others."""
    import sys

    for fn in list(_BEFORE):
        try:
            fn()
        except Exception as e:  # the teardown goes on: a peer may be gone
            print(f"torchhpc: before the process group's teardown: {type(e).__name__}: {e}", file=sys.stderr, flush=True)


def settle_at_exit() -> None:
    """Run :func:`gloo_workers_settle` when the interpreter exits (once; atexit runs before finalization)."""
    global _REGISTERED
    if not _REGISTERED:
        _REGISTERED = True
        atexit.register(gloo_workers_settle)
