"""What the supervisor does after each class of failure: the policy table of docs/resilience.md.

The classes are the verdict's (:data:`torchhpc.diagnose.classify.CLASSES`). A restart helps
only where the cause is outside the program: a node, the network, a stall. A restart after an
exception, an out-of-memory or an import error would fail the same way and burn the allocation.

The exit code each class ends the job with is :data:`EXIT_CODES`, kept in
:mod:`torchhpc.core.exitcodes` so that the scheduler backends render failure policies from it too.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from torchhpc.core.units import counted

__all__ = ["NEVER", "POLICY", "RESTART_CLASSES", "action_for", "choose", "why_not"]

# class -> (action, why); the action is "restart" or "end"
POLICY: dict[str, tuple[str, str]] = {
    "node-failure": ("restart", "exclude the node, go on on a spare (or requeue without it)"),
    "hang": ("restart", "a stall (a dead peer, a stuck collective) is not in the program's logic as a rule"),
    "network": ("restart", "rendezvous, NCCL or socket errors come from the fabric or a peer"),
    "lost-peer": ("restart", "a rank vanished without a traceback: probe the nodes, exclude a dead one"),
    "user-exception": ("end", "the same code fails the same way: fix it"),
    "cuda-oom": ("end", "the same batch runs out of memory again"),
    "host-oom": ("end", "the same job runs out of memory again"),
    "gpu-assignment": ("end", "the same ranks land on the same GPUs again: fix the ranks-per-GPU layout"),
    "environment": ("end", "an import error or a wrong torch does not heal by itself"),
    "collective-mismatch": ("end", "the program's ranks disagree on a collective: it repeats on every attempt"),
    "native-crash": ("end", "a crash in C++ repeats as a rule: read the rank's log"),
    "no-progress": ("end", "restarts that never advance the checkpoint burn the allocation: a person looks"),
    "time-limit": ("end", "the stop protocol (--signal-before, --requeue) handles the time limit"),
    "preempted": ("end", "the stop protocol (--requeue) handles preemption"),
    "cancelled": ("end", "someone cancelled the job"),
    "unknown": ("end", "no evidence names a cause: nothing says a restart would help"),
}
RESTART_CLASSES = frozenset(k for k, (a, _w) in POLICY.items() if a == "restart")
NEVER = frozenset(k for k, (a, _w) in POLICY.items() if a == "end")


def action_for(klass: str) -> str:
    """``"restart"`` or ``"end"`` for a verdict class (an unknown class ends: never guess)."""
    return POLICY.get(klass, ("end", ""))[0]


def why_not(klass: str, count: int, max_restarts: int) -> str:
    """Why attempt ``count`` (0-based), ended by ``klass``, gets no restart; "" when it does."""
    if action_for(klass) != "restart":
        return f"not restarting after {klass}: {POLICY.get(klass, ('', 'never guessed'))[1]}"
    if count >= max_restarts:
        return (f"not restarting: {counted(max_restarts, 'restart')} allowed, {count} done; "
                f"the job ends with the {klass} verdict (torchhpc diagnose)")
    return ""


def choose(allocation: Sequence[str], previous: Sequence[str], usable: Iterable[str], n: int) -> list[str]:
    """N usable nodes: the previous attempt's survivors first (their caches are warm), then the
    spares, in the allocation's order. Fewer than N when fewer are usable."""
    ok = set(usable)
    keep = [h for h in previous if h in ok]
    more = [h for h in allocation if h in ok and h not in keep]
    picked = set((keep + more)[:n])
    return [h for h in allocation if h in picked]
