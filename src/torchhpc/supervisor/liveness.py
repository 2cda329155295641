"""Which of an attempt's nodes died: the ranks' heartbeats first, the slurmd probe as confirmation and fallback.

Why: the probe alone (a TCP connect to each step node's slurmd every 2 s, a node dead after two misses in a
row, each waiting up to 1 s) noticed a lost node 3-5 s after the fault, half of a restart. Every Python rank's
boot (boot/sitecustomize.py, no code change) sends a datagram every ``BEAT_EVERY`` s to the supervisor's
socket, ``$TORCHHPC_HEARTBEAT`` (``host:port``), naming its node. A node that has been heard in this attempt
and then goes silent for ``SILENT_S`` is probed at once, and one failed probe confirms it: the silence was the
first miss. Detection is then about a second after the fault.

Silence alone never fails a node: a rank starved at a load average of 30 (or stopped in a debugger, or
swapping) goes quiet while its node's slurmd still completes a TCP handshake (the kernel answers), so the
probe clears it and the silence is counted again from then. A node never heard in the attempt (a container
without the boot, a non-Python program, a rank still starting) keeps the probe's own rule; a node heard is not
probed on the probe's round (its silence is watched instead): a probe of a node lost a moment before held the
loop for its whole timeout, and detection took 2 s instead of 1.
"""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any, Optional

__all__ = ["BEAT_EVERY", "HEARTBEAT_VAR", "PROBE_TIMEOUT_S", "SILENT_S", "Heartbeats", "Liveness"]

HEARTBEAT_VAR = "TORCHHPC_HEARTBEAT"  # boot/sitecustomize.py reads the same name (stdlib only: held equal by a test)
BEAT_EVERY = 0.2  # seconds between a rank's datagrams (boot/sitecustomize.py's HEARTBEAT_EVERY)
SILENT_S = 0.6  # a heard node silent this long is probed at once: three beats missed
# A live slurmd completes the TCP handshake in well under a millisecond, even on a busy node (the kernel
# answers); 1 s is generous for the probe's round, and a node counts as dead only after its misses in a row.
PROBE_TIMEOUT_S = 1.0
CONFIRM_TIMEOUT_S = 0.5  # that probe's connect: a live slurmd answers in well under a millisecond
PREFIX = b"torchhpc-hb "


class Heartbeats:
    """The supervisor's heartbeat socket (UDP, every address, a free port) and when each node was last heard."""

    def __init__(self, host: str) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("", 0))
        self.sock.setblocking(False)
        self.address = f"{host}:{self.sock.getsockname()[1]}"  # what the ranks send to
        self.last: dict[str, float] = {}

    def reset(self) -> None:
        """A new attempt: no node has been heard yet."""
        self.drain(0.0)
        self.last.clear()

    def drain(self, now: float) -> None:
        """Every datagram waiting: its node heard at ``now`` (0: read and dropped)."""
        while True:
            try:
                data = self.sock.recv(256)
            except OSError:  # nothing more (BlockingIOError), or the socket is gone
                return
            if now and data.startswith(PREFIX):
                node = data[len(PREFIX):].split(b" ", 1)[0].decode(errors="replace")
                self.last[node] = now

    def wait(self, seconds: float, clock: Callable[[], float] = time.time) -> None:
        """Sleep ``seconds``, noting every datagram as it arrives."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            ready, _, _ = select.select([self.sock], [], [], left)
            if ready:
                self.drain(clock())

    def silent(self, nodes: Sequence[str], now: float, after: float = SILENT_S) -> list[str]:
        """The nodes heard in this attempt, and silent for more than ``after`` seconds."""
        return [h for h in nodes if h in self.last and now - self.last[h] > after]

    def close(self) -> None:
        self.sock.close()


class Liveness:
    """One attempt's node checks: ``dead(now)`` says which nodes died and what found it ("heartbeat", "probe")."""

    def __init__(self, alloc: Any, nodes: Sequence[str], probe_every: float, misses: int, probe_timeout: float,
                 beats: Optional[Heartbeats], now: float) -> None:
        self.alloc, self.nodes, self.beats = alloc, list(nodes), beats
        self.probe_every, self.need, self.probe_timeout = probe_every, misses, probe_timeout
        self.misses = dict.fromkeys(self.nodes, 0)
        self.next_check = now + probe_every
        self.probed = False  # whether the last call ran the probe round (the loop's other checks ride on it)

    def wait(self, seconds: float, clock: Callable[[], float] = time.time) -> None:
        if self.beats is not None:
            self.beats.wait(seconds, clock)
        else:
            time.sleep(seconds)

    def dead(self, now: float) -> tuple[list[str], str]:
        self.probed = False
        if self.beats is not None:
            gone = []
            for h in self.beats.silent(self.nodes, now):
                if self.alloc.alive(h, timeout=CONFIRM_TIMEOUT_S):
                    self.beats.last[h] = now  # starved, not dead: the silence counts again from here
                else:
                    gone.append(h)
            if gone:
                return gone, "heartbeat"
        if now < self.next_check:
            return [], ""
        self.probed, self.next_check = True, now + self.probe_every
        for h in self.nodes:
            if self.beats is not None and h in self.beats.last:  # heard: its silence speaks for it (above), and a
                self.misses[h] = 0  # probe of a node lost a moment ago would hold the loop for its whole timeout
                continue
            self.misses[h] = 0 if self.alloc.alive(h, timeout=min(self.probe_timeout, self.probe_every)) else self.misses[h] + 1
        if any(self.misses.values()):  # confirm a miss at once, not a probe interval later
            self.next_check = now
        return [h for h, n in self.misses.items() if n >= self.need], "probe"
