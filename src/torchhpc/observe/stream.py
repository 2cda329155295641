"""The node side of the live ``torchhpc top``: one process per node for the whole session.

``top --once`` starts :mod:`torchhpc.observe.sample` once per node, a fresh Python each time
(about 0.1 CPU-second with its py-spy runs, fine once). Refreshing every 2 s that way would cost
the node ~9 % of a core, far over the 1 % goal; so the live table starts this module once per
node (one ``srun --overlap`` step that stays) and it prints a batch of JSON lines every
``every`` seconds, ended by ``{"batch": N}``:

* CPU % over the last interval, memory and state come from ``/proc`` each time (microseconds);
  the rank processes are found once and looked for again only when one is gone;
* the collective share comes from one ``py-spy record`` per rank over a longer ``window``
  (default 20 s at 5 samples a second: py-spy's start and each sample cost CPU), restarted when it ends: each batch carries the
  latest finished window (the first ones last 1, 2, 4, 8, 16 s, so the first tables have shares);
* GPU tools run once per window too (``nvidia-smi`` costs ~50 ms a call).

It stops when its standard output closes (``top`` quit) or its parent ``srun`` is cancelled.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Optional, TextIO

from torchhpc.diagnose.probe import _cpu_ticks, _py_spy, find_ranks, node_args
from torchhpc.observe.sample import RankSample, _gpu_health, _gpus, _spy_start, _state_rss, parse_raw

__all__ = ["LIVE_RATE_HZ", "WINDOW_S", "watch"]

WINDOW_S = 60  # seconds of stack samples per py-spy run in the live view (its start-up is the cost)
LIVE_RATE_HZ = 2  # samples a second in the live view: 120 a window; each costs py-spy ~0.5 ms of CPU
RESCAN_S = 30.0  # look for (re)started rank processes this often even when none is gone


class _Window:
    """One py-spy run per rank; its counts once it has finished."""

    def __init__(self, spy: str, pids: Mapping[int, int], seconds: int, rate: int, tmp: str) -> None:
        self.tmp = tmp
        self.procs = {r: _spy_start(spy, p, seconds, rate, os.path.join(tmp, f"{r}.txt")) for r, p in pids.items()}

    def done(self) -> bool:
        return all(p.poll() is not None for p in self.procs.values())

    def counts(self) -> dict[int, tuple[int, int, Counter[str]]]:
        out = {}
        for r in self.procs:
            try:
                with open(os.path.join(self.tmp, f"{r}.txt")) as f:
                    out[r] = parse_raw(f.read())
            except OSError:
                continue
        return out

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
            p.wait()
            if p.stderr is not None:
                p.stderr.close()


def watch(match: Mapping[str, str], host: str, every: float = 2.0, window: int = WINDOW_S, rate: int = LIVE_RATE_HZ,
          count: int = 0, out: Optional[TextIO] = None) -> int:
    """Print a batch every ``every`` seconds (``count`` batches; 0: until the output closes)."""
    stream = out or sys.stdout
    spy = _py_spy()
    hz = os.sysconf("SC_CLK_TCK")
    pids: dict[int, int] = {}
    scanned = 0.0
    ticks: dict[int, Optional[int]] = {}
    last = time.monotonic()
    counts: dict[int, tuple[int, int, Counter[str]]] = {}
    gpu: dict[int, tuple[Optional[float], Optional[float]]] = {}
    health: dict[int, str] = {}
    win: Optional[_Window] = None
    batch = windows = 0
    with tempfile.TemporaryDirectory(prefix="torchhpc-top-") as tmp:
        try:
            while count == 0 or batch < count:
                now = time.monotonic()
                if not pids or now - scanned > RESCAN_S or any(_cpu_ticks(p) is None for p in pids.values()):
                    pids, scanned = find_ranks(match), now
                if win is not None and win.done():
                    counts, win = win.counts(), None
                if win is None and spy and pids:
                    # the first windows are short (1, 2, 4... s), so the first tables already have shares
                    win = _Window(spy, pids, min(window, 2 ** windows), rate, tmp)
                    windows += 1
                    gpu, health = _gpus(pids), _gpu_health(pids)
                wall = max(1e-3, now - last)
                last = now
                lines = []
                for r, p in sorted(pids.items()):
                    t = _cpu_ticks(p)
                    before = ticks.get(r)
                    cpu = 100.0 * (t - before) / hz / wall if t is not None and before is not None else 0.0
                    ticks[r] = t
                    state, rss = _state_rss(p)
                    total, inside, calls = counts.get(r, (0, 0, Counter()))
                    util, mem = gpu.get(r, (None, None))
                    error = "" if spy else "py-spy is not installed here (pip install py-spy): no collective share"
                    s = RankSample(r, host, p, state, round(cpu, 1), round(rss, 1), total, inside, dict(calls),
                                   util, mem, error, health.get(r, ""))
                    lines.append(json.dumps(asdict(s) | {"error": s.error[:300]}))  # whole through srun
                lines.append(json.dumps({"batch": batch, "host": host}))
                stream.write("\n".join(lines) + "\n")
                stream.flush()
                batch += 1
                time.sleep(max(0.0, every - (time.monotonic() - now)))
        except BrokenPipeError:
            pass
        finally:
            if win is not None:
                win.stop()
    return 0


def _main(argv: Sequence[str]) -> int:
    """``python -m torchhpc.observe.stream [--every S] [--window S] [--rate HZ] [--count N] KEY=VALUE...``"""
    opts, match, host = node_args(argv, {"--every": 2.0, "--window": WINDOW_S, "--rate": LIVE_RATE_HZ, "--count": 0})
    try:
        return watch(match, host, opts["--every"], int(opts["--window"]), int(opts["--rate"]), int(opts["--count"]))
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    try:
        raise SystemExit(_main(sys.argv[1:]))
    finally:
        try:
            sys.stdout.close()
        except BrokenPipeError:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
