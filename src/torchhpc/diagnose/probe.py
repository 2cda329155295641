"""The node-side half of the hang watch: ``python -m torchhpc.diagnose.probe KEY=VALUE...``.

Run once per node (``srun --overlap`` for Slurm; in-process for the local scheduler) by
:func:`torchhpc.diagnose.hang.probe_job`: it finds the job's rank processes in ``/proc`` (their
environment names the job and the rank), samples their CPU time twice, and dumps each one's
Python stack with py-spy where it is installed, one JSON line per rank. Standard library only:
it runs on the submitting interpreter on every node, before anything else of the job is read.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Optional

__all__ = ["CPU_SAMPLE_S", "LINE_MAX", "RankStack", "ask_nodes", "find_ranks", "line_of", "node_args",
           "one_per_process", "parse_py_spy", "probe", "why_no_stack"]

CPU_SAMPLE_S = 2.0  # how long a probe watches CPU time: a busy rank uses some in that time

_FRAME = re.compile(r"^\s+(\S+) \((.+):(\d+)\)\s*$")  # py-spy: "    func (path/file.py:12)"


@dataclass(frozen=True)
class RankStack:
    """One rank process on one node: its CPU use over the probe, and its Python stack (innermost first)."""

    rank: int
    host: str
    pid: int
    cpu_s: float  # CPU seconds used during the probe's sample
    frames: tuple[tuple[str, str, int], ...] = ()  # (function, file, line), innermost first
    error: str = ""  # why there is no stack


def _environ(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return {}
    return dict(item.decode(errors="replace").split("=", 1) for item in raw.split(b"\0") if b"=" in item)


def _cpu_ticks(pid: int) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime + stime
    except (OSError, IndexError, ValueError):
        return None


def _is_python(pid: int) -> bool:
    try:
        exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        return False
    return exe.startswith("python")


def find_ranks(match: Mapping[str, str]) -> dict[int, int]:
    """rank -> pid of the Python processes here whose environment has every ``match`` item and a RANK."""
    found: dict[int, int] = {}
    forked: set[int] = set()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        env = _environ(int(name))
        if "RANK" not in env or any(env.get(k) != v for k, v in match.items()):
            continue
        if not _is_python(int(name)) or not env["RANK"].isdigit():
            continue
        rank, warm = int(env["RANK"]), _warm_rank(int(name))
        if warm:  # a warm client (boot/warm.py): the rank is the standby's child it names
            found[rank] = warm
            forked.add(rank)
        # the rank's own process, not a parent that carries the same variables (keep the newest)
        elif rank not in forked and (rank not in found or int(name) > found[rank]):
            found[rank] = int(name)
    return found


def _warm_rank(pid: int) -> int:
    """The rank a warm client stands for (its name is ``warm:PID``); 0 for any other process."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            word, _, target = f.read().strip().partition(":")
    except OSError:
        return 0
    return int(target) if word == "warm" and target.isdigit() and _is_python(int(target)) else 0


def _py_spy() -> Optional[str]:
    here = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return here if os.access(here, os.X_OK) else shutil.which("py-spy")


def parse_py_spy(text: str) -> tuple[tuple[str, str, int], ...]:
    """The main thread's frames from ``py-spy dump`` output, innermost first."""
    frames: list[tuple[str, str, int]] = []
    started = False
    for line in text.splitlines():
        if line.startswith("Thread "):
            if started:
                break  # the first thread py-spy lists is the main thread
            started = True
            continue
        m = _FRAME.match(line)
        if started and m:
            frames.append((m.group(1), m.group(2), int(m.group(3))))
    return tuple(frames)


SPY_TIMEOUT_S = 30.0
EXITED = "the process exited while py-spy read it"  # why no stack: it was gone (diagnose/hang.py: no hang)
BUSY_CPU_S = 0.1  # CPU seconds in the sample that make a rank busy, not hung (64 ranks importing on 2 cores: 0.03-0.05)


def why_no_stack(stderr: str, alive: bool = True) -> str:
    """Why ``py-spy dump`` read no stack, in words: its error, never the tail of its backtrace (whose
    last line, "10: main", was once all a verdict said)."""
    text = stderr.lower()
    if not alive or "no such process" in text:
        return EXITED
    if "permission denied" in text or "operation not permitted" in text or "ptrace" in text:
        return ("permission denied: py-spy may not attach to it (run as the rank's user, as root, or with "
                "kernel.yama.ptrace_scope=0)")
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    said = next((ln for ln in lines if ln.lower().startswith("error")), "")
    said = said or next((ln for ln in lines if not re.match(r"^\d+:", ln)), "")
    return f"py-spy read no stack: {said[:200]}" if said else "py-spy read no stack and said nothing"


def probe(match: Mapping[str, str], host: str, sample_s: float = CPU_SAMPLE_S) -> list[RankStack]:
    """This node's ranks of the job: CPU used over ``sample_s`` seconds, and each one's stack."""
    pids = find_ranks(match)
    before = {r: _cpu_ticks(p) for r, p in pids.items()}
    time.sleep(sample_s)
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    spy = _py_spy()
    out = []
    for rank, pid in sorted(pids.items()):
        after = _cpu_ticks(pid)
        b = before.get(rank)
        cpu = (after - b) / hz if after is not None and b is not None else 0.0
        frames: tuple[tuple[str, str, int], ...] = ()
        error = ""
        if spy is None:
            error = "py-spy is not installed here (pip install py-spy)"
        else:
            try:
                for _try in range(2):  # once more when it failed on a live process: a read caught mid-change
                    done = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True,
                                          timeout=SPY_TIMEOUT_S)
                    frames = parse_py_spy(done.stdout)
                    if frames or not os.path.exists(f"/proc/{pid}"):
                        break
                if not frames:
                    error = why_no_stack(done.stderr, os.path.exists(f"/proc/{pid}"))
            except subprocess.TimeoutExpired:
                error = f"py-spy timed out after {SPY_TIMEOUT_S:.0f} s (the node is loaded)"
            except OSError as e:
                error = f"py-spy could not run: {e}"
        out.append(RankStack(rank, host, pid, cpu, frames, error))
    return out


LINE_MAX = 1000  # srun passes longer output lines on in pieces (measured: 1024 bytes), which no parser can join


def line_of(s: RankStack) -> str:
    """One rank's JSON line, short enough to cross srun whole: the outermost frames go first (the
    culprit's own frame and the collective a rank waits in are the innermost ones). Measured on
    64 ranks still importing torch: their 40-frame stacks were 3-5 KB, split by srun mid-line."""
    frames = s.frames
    while True:
        text = json.dumps(asdict(s) | {"frames": frames, "error": s.error[:300]})
        if len(text) <= LINE_MAX or not frames:
            return text
        frames = frames[:-1]


def node_args(argv: Sequence[str], flags: Mapping[str, float]) -> tuple[dict[str, float], dict[str, str], str]:
    """A node-side program's command line (this probe, top's sampler and stream): ``--FLAG VALUE``
    options over ``flags``' defaults, the ``KEY=VALUE`` items that mark the job's ranks, and this
    node's name. In a Slurm step the node joins the match (the dev cluster's nodes share one /proc);
    a local job's node is "localhost", as in its logs."""
    args, opts = list(argv), dict(flags)
    for flag in opts:
        if flag in args:
            i = args.index(flag)
            opts[flag] = float(args[i + 1])
            del args[i:i + 2]
    match = dict(a.split("=", 1) for a in args if "=" in a)
    node = os.environ.get("SLURMD_NODENAME")
    if "SLURM_JOB_ID" in match and node:
        match["SLURMD_NODENAME"] = node
    local = match.get("TORCHELASTIC_RUN_ID", "").startswith("local-")
    return opts, match, "localhost" if local else node or os.uname().nodename.split(".")[0]


def ask_nodes(runner: Any, argv: Sequence[str], timeout: float, empty_fails: bool = False
              ) -> tuple[list[dict[str, Any]], list[str]]:
    """Run a node-side program on the job's nodes (``argv``: the allocation's command for it) and read
    back its JSON objects, one a line, and its other stderr lines. RuntimeError when it printed nothing
    and failed (or, with ``empty_fails``, printed nothing at all)."""
    done = runner.run(list(argv), check=False, timeout=timeout)
    if not done.stdout.strip() and (done.returncode != 0 or empty_fails):
        detail = done.stderr.strip().splitlines()
        raise RuntimeError(f"the per-node probe ({' '.join(argv[:6])} ...) answered {done.returncode}: "
                           + (detail[-1] if detail else "no output"))
    found = []
    for line in done.stdout.splitlines():
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if isinstance(d, dict):
            found.append(d)
    return found, [ln for ln in done.stderr.splitlines() if ln.strip()]


def one_per_process(found: Sequence[dict[str, Any]], make: Callable[..., Any]) -> list[Any]:
    """``make(**d)`` of each object :func:`ask_nodes` read, one per process (PBS Pro's pbsdsh runs a copy per
    slot); an object ``make`` does not take is left out."""
    out: dict[tuple[str, int], Any] = {}
    for d in found:
        try:
            s = make(**d)
        except TypeError:
            continue
        out[s.host, s.pid] = s
    return list(out.values())


def _main(argv: Sequence[str]) -> int:
    """``python -m torchhpc.diagnose.probe KEY=VALUE...``: probe this node, print JSON lines."""
    _opts, match, host = node_args(argv, {})
    stacks = probe(match, host)
    for s in stacks:
        print(line_of(s), flush=True)
    if not stacks:  # said on stderr, which the watch passes on: a node with no rank is worth knowing
        print(f"torchhpc: hang: no rank process of {match} found on {host}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
