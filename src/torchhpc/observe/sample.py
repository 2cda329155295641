"""The node side of ``torchhpc top``: one short look at this node's ranks of one job.

Run once per node per refresh (``srun --overlap`` into the allocation on Slurm; in-process for
the local scheduler), it finds the job's rank processes in ``/proc`` as the hang watch does
(:func:`torchhpc.diagnose.probe.find_ranks`), and over ``duration`` seconds:

* reads each rank's CPU time before and after (``/proc/PID/stat``) and its resident memory
  (``/proc/PID/statm``);
* samples each rank's Python stack ``rate`` times a second with ``py-spy record --nonblocking
  --idle`` (one py-spy per rank for the whole window: starting a ``py-spy dump`` per sample costs
  far more; ``--nonblocking`` never pauses the rank; ``--idle`` keeps the samples where the rank
  waits, which are the ones that matter), and counts the samples inside a torch.distributed
  collective with the hang watch's frame finder (:func:`torchhpc.diagnose.hang_verdict.collective`);
* asks ``nvidia-smi`` (per process and per GPU) or ``rocm-smi`` (per card, by ``LOCAL_RANK``)
  for GPU utilization and memory, only where the tool exists on the node.

Prints one JSON object per rank (``python -m torchhpc.observe.sample KEY=VALUE ...``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from contextlib import suppress
from dataclasses import asdict, dataclass, field
from typing import Optional

from torchhpc.diagnose.hang_verdict import collective
from torchhpc.diagnose.probe import _cpu_ticks, _environ, _py_spy, find_ranks, node_args

__all__ = ["RankSample", "gpu_by_pid", "parse_raw", "sample"]

DURATION_S = 1  # py-spy's --duration counts whole seconds
RATE_HZ = 20  # stack samples per second per rank
_STATES = {"R": "running", "S": "sleeping", "D": "disk", "Z": "zombie", "T": "stopped", "t": "stopped"}


@dataclass(frozen=True)
class RankSample:
    """One rank process over one look: what ``top`` shows per rank, from this node."""

    rank: int
    host: str
    pid: int
    state: str  # the kernel's word for the process (running, sleeping, ...)
    cpu_pct: float  # CPU used over the window, in % of one core
    rss_mb: float
    samples: int = 0  # stack samples py-spy took
    in_collective: int = 0  # of them, inside a torch.distributed collective
    calls: dict[str, int] = field(default_factory=dict)  # collective -> samples
    gpu_util: Optional[float] = None  # % (the GPU the rank uses)
    gpu_mem_mb: Optional[float] = None  # this process's GPU memory (nvidia-smi), else its card's
    error: str = ""
    gpu_health: str = ""  # "ok", or what holds its GPU back: throttle reasons, ECC errors, XIDs ("": no NVIDIA GPU)


def _state_rss(pid: int) -> tuple[str, float]:
    try:
        with open(f"/proc/{pid}/stat") as f:
            letter = f.read().rsplit(")", 1)[1].split()[0]
        with open(f"/proc/{pid}/statm") as f:
            pages = int(f.read().split()[1])
    except (OSError, IndexError, ValueError):
        return "gone", 0.0
    return _STATES.get(letter, letter), pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def parse_raw(text: str) -> tuple[int, int, Counter[str]]:
    """``py-spy record --format raw`` (collapsed stacks: ``frame;frame;... COUNT``, outermost first)
    -> (samples, samples in a collective, collective -> samples), of the main thread only, and
    leaving out start-up (imports and ``init_process_group``): the share is the training loop's."""
    total = inside = 0
    calls: Counter[str] = Counter()
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        parts = stack.split(";")
        if parts[0].split(" (")[0].endswith("_bootstrap") and "threading.py" in parts[0]:
            continue  # a thread the rank started (tqdm's monitor, a data loader): not its main loop
        if any(p.startswith("init_process_group ") or "<frozen importlib" in p for p in parts):
            continue  # start-up (imports, the rendezvous): every rank waits for the slowest starter there
        frames = []
        for part in reversed(parts):  # innermost first, as collective() reads them
            fn, _, where = part.partition(" (")
            path, _, ln = where.rstrip(")").rpartition(":")
            frames.append((fn.strip(), path, int(ln) if ln.isdigit() else 0))
        n = int(count)
        total += n
        call = collective(frames)
        if call:
            inside += n
            calls[call] += n
    return total, inside, calls


def _spy_start(spy: str, pid: int, duration: int, rate: int, out: str) -> subprocess.Popen[bytes]:
    argv = [spy, "record", "--pid", str(pid), "--rate", str(rate), "--duration", str(duration), "--format", "raw",
            "--nonblocking", "--idle", "--output", out]
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _csv(argv: Sequence[str]) -> list[list[str]]:
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [[c.strip() for c in ln.split(",")] for ln in done.stdout.splitlines() if ln.strip()]


def gpu_by_pid(apps: Sequence[Sequence[str]], gpus: Sequence[Sequence[str]]) -> dict[int, tuple[float, float]]:
    """pid -> (its GPU's utilization %, its own GPU memory MiB), from nvidia-smi's CSV answers to
    ``--query-compute-apps=pid,gpu_uuid,used_memory`` and ``--query-gpu=uuid,utilization.gpu``."""
    util = {row[0]: float(row[1]) for row in gpus if len(row) >= 2 and row[1].replace(".", "").isdigit()}
    return {int(row[0]): (util[row[1]], float(row[2]) if row[2].replace(".", "").isdigit() else 0.0)
            for row in apps if len(row) >= 3 and row[0].isdigit() and row[1] in util}


# nvidia-smi's clocks event (throttle) reasons that are faults: the GPU is held back by heat or by the
# hardware, not by its load. SW power cap (0x4) is not among them: at full load a GPU runs at its power
# limit by design (an H200 at 100 % reports it all the time); it is shown apart, after "ok".
_THROTTLE = {0x8: "hw-slowdown", 0x20: "sw-thermal", 0x40: "hw-thermal", 0x80: "power-brake"}
_POWER_CAP = 0x4
CAPPED = "ok (capped)"  # no fault; the clocks are at the power limit (normal under full load)
_XID = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F:.]+)\): (\d+)")


def gpu_health(gpus: Sequence[Sequence[str]], kernel_log: str = "") -> dict[str, str]:
    """GPU uuid -> "ok" or its faults (thermal or hardware slowdown, ECC, XID; "ok (capped)": no fault, at its
    power limit), from nvidia-smi's CSV answer to ``--query-gpu=uuid,pci.bus_id,
    clocks_event_reasons.active,ecc.errors.uncorrected.volatile.total`` and the kernel log's ``NVRM: Xid``
    lines (``dmesg``: XIDs are nowhere else; unreadable without the right, then only the first two)."""
    xids: dict[str, list[str]] = {}
    for m in _XID.finditer(kernel_log):
        xids.setdefault(_bus(m.group(1)), []).append(m.group(2))
    out: dict[str, str] = {}
    for row in gpus:
        if len(row) < 4:
            continue
        uuid, bus, reasons, ecc = (c.strip() for c in row[:4])
        bad, capped = [], False
        with suppress(ValueError):
            mask = int(reasons, 16) if reasons.lower().startswith("0x") else int(reasons)
            bad += [name for bit, name in _THROTTLE.items() if mask & bit]
            capped = bool(mask & _POWER_CAP)
        if ecc.isdigit() and int(ecc) > 0:
            bad.append(f"ecc:{ecc}")
        seen = xids.get(_bus(bus), [])
        if seen:
            bad.append("xid:" + ",".join(sorted(set(seen), key=int)))
        out[uuid] = ",".join(bad) or (CAPPED if capped else "ok")
    return out


def _bus(pci: str) -> str:
    """"86:00" of nvidia-smi's "00000000:86:00.0" and the kernel's "0000:86:00" (bus and device)."""
    m = re.search(r"([0-9a-f]{2}:[0-9a-f]{2})(?:\.\d)?$", pci.strip().lower())
    return m.group(1) if m else pci.strip().lower()


def _gpu_health(pids: Mapping[int, int]) -> dict[int, str]:
    """rank -> its GPU's health (:func:`gpu_health`), NVIDIA only; {} without nvidia-smi."""
    if not shutil.which("nvidia-smi"):
        return {}
    apps = _csv(["nvidia-smi", "--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader,nounits"])
    fields = "uuid,pci.bus_id,{},ecc.errors.uncorrected.volatile.total"
    rows = _csv(["nvidia-smi", "--query-gpu=" + fields.format("clocks_event_reasons.active"), "--format=csv,noheader"])
    if not rows:  # drivers before 535 call it clocks_throttle_reasons
        rows = _csv(["nvidia-smi", "--query-gpu=" + fields.format("clocks_throttle_reasons.active"),
                     "--format=csv,noheader"])
    try:
        log = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.TimeoutExpired):
        log = ""
    health = gpu_health(rows, log)
    uuid_of = {int(r[0]): r[1].strip() for r in apps if len(r) >= 2 and r[0].strip().isdigit()}
    return {r: health[uuid_of[p]] for r, p in pids.items() if uuid_of.get(p) in health}


def rocm_cards(text: str) -> dict[int, tuple[float, float]]:
    """card index -> (use %, VRAM used %) from ``rocm-smi --showuse --showmemuse --json``."""
    try:
        d = json.loads(text)
    except ValueError:
        return {}
    out: dict[int, tuple[float, float]] = {}
    for card, vals in d.items() if isinstance(d, dict) else ():
        if not (card.startswith("card") and card[4:].isdigit() and isinstance(vals, dict)):
            continue
        use = next((v for k, v in vals.items() if "use (%)" in k and "Memory" not in k), None)
        mem = next((v for k, v in vals.items() if "Memory" in k and "%" in k), None)
        try:
            out[int(card[4:])] = (float(use), float(mem))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue
    return out


def _gpus(pids: Mapping[int, int]) -> dict[int, tuple[Optional[float], Optional[float]]]:
    """rank -> (GPU util %, GPU memory): nvidia-smi per process, else rocm-smi per card (LOCAL_RANK)."""
    if shutil.which("nvidia-smi"):
        apps = _csv(["nvidia-smi", "--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv,noheader,nounits"])
        gpus = _csv(["nvidia-smi", "--query-gpu=uuid,utilization.gpu", "--format=csv,noheader,nounits"])
        by_pid = gpu_by_pid(apps, gpus)
        return {r: by_pid[p] for r, p in pids.items() if p in by_pid}
    if shutil.which("rocm-smi"):
        try:
            text = subprocess.run(["rocm-smi", "--showuse", "--showmemuse", "--json"], capture_output=True,
                                  text=True, timeout=10).stdout
        except (OSError, subprocess.TimeoutExpired):
            return {}
        cards = rocm_cards(text)
        out: dict[int, tuple[Optional[float], Optional[float]]] = {}
        for r, p in pids.items():
            local = _environ(p).get("LOCAL_RANK", "")
            if local.isdigit() and int(local) in cards:
                out[r] = (cards[int(local)][0], None)
        return out
    return {}


def sample(match: Mapping[str, str], host: str, duration: int = DURATION_S, rate: int = RATE_HZ) -> list[RankSample]:
    """This node's ranks of the job over ``duration`` seconds (see the module's docstring)."""
    pids = find_ranks(match)
    if not pids:
        return []
    spy = _py_spy()
    hz = os.sysconf("SC_CLK_TCK")
    before = {r: _cpu_ticks(p) for r, p in pids.items()}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="torchhpc-top-") as tmp:
        spies = {r: _spy_start(spy, p, duration, rate, os.path.join(tmp, f"{r}.txt")) for r, p in pids.items()} if spy else {}
        gpu, health = _gpus(pids), _gpu_health(pids)
        if not spies:
            time.sleep(duration)
        errors: dict[int, str] = {}
        for r, proc in spies.items():
            try:
                _, err = proc.communicate(timeout=duration + 20)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
            if proc.returncode != 0:
                errors[r] = (err.decode(errors="replace").strip().splitlines() or ["py-spy failed"])[-1]
        wall = max(1e-3, time.monotonic() - t0)
        out = []
        for r, p in sorted(pids.items()):
            after, b = _cpu_ticks(p), before[r]
            cpu = 100.0 * (after - b) / hz / wall if after is not None and b is not None else 0.0
            state, rss = _state_rss(p)
            total = inside = 0
            calls: Counter[str] = Counter()
            if r in spies:
                try:
                    with open(os.path.join(tmp, f"{r}.txt")) as f:
                        total, inside, calls = parse_raw(f.read())
                except OSError:
                    errors.setdefault(r, "py-spy wrote no samples")
            error = errors.get(r, "") if not total else ""
            if not spy:
                error = "py-spy is not installed here (pip install py-spy): no collective share"
            util, mem = gpu.get(r, (None, None))
            out.append(RankSample(r, host, p, state, round(cpu, 1), round(rss, 1), total, inside, dict(calls),
                                  util, mem, error, health.get(r, "")))
    return out


def _main(argv: Sequence[str]) -> int:
    """``python -m torchhpc.observe.sample [--duration S] [--rate HZ] KEY=VALUE...``: JSON lines."""
    opts, match, host = node_args(argv, {"--duration": DURATION_S, "--rate": RATE_HZ})
    found = sample(match, host, int(opts["--duration"]), int(opts["--rate"]))
    for s in found:
        print(json.dumps(asdict(s) | {"error": s.error[:300]}), flush=True)  # one line, whole through srun
    if not found:
        print(f"torchhpc: top: no rank process of the job on {host}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
