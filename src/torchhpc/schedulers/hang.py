"""Hang detection with no change to the user's code: find the quiet ranks, read their stacks, name the culprit.

A hung distributed job looks like a healthy one to the scheduler: every process is alive. What
tells them apart is progress. While ``run --wait --hang-timeout S`` (or ``wait --hang-timeout S``)
follows a job:

1. **quiet**: no rank has written a line to its own log for S seconds (the per-rank files'
   last-write times, which torchhpc already keeps);
2. **probe** every node (``srun --overlap`` once per node for Slurm; directly for the local
   scheduler): on each node, :func:`probe` finds the job's rank processes in ``/proc`` (their
   environment names the job and the rank), samples their CPU time twice, and dumps each one's
   Python stack with py-spy where it is installed. A rank that used CPU is computing, not hung:
   then nothing is done and the watch goes on;
3. **name the culprit** (:func:`culprit`): the rank whose stack is not in a collective while the
   others wait in one, with its innermost user frame (file:line);
4. **act** as the user chose (``--on-hang cancel``, the default, or ``requeue``), after saving
   the diagnosis in the job directory (``hang.json``), where ``torchhpc diagnose`` reads it.

Without py-spy the stacks cannot be read from outside: the verdict says so and names the quiet
ranks only (``pip install py-spy``, or the ``diagnose`` extra).
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
from dataclasses import asdict, dataclass, field
from typing import Optional

from torchhpc.core.proc import Runner
from torchhpc.errors import TorchHPCError

__all__ = [
    "HANG_FILE",
    "HangWatch",
    "RankStack",
    "culprit",
    "in_collective",
    "probe",
    "probe_job",
    "quiet_for",
    "user_frame",
]

HANG_FILE = "hang.json"  # in the job directory: the hang's diagnosis, for `torchhpc diagnose`
CPU_SAMPLE_S = 2.0  # how long a probe watches CPU time: a busy rank uses some in that time
# torch.distributed calls a rank waits in while a peer is late (the py-spy frame names)
_COLLECTIVES = re.compile(
    r"^(all_reduce|all_gather\w*|reduce_scatter\w*|broadcast\w*|barrier|reduce|gather\w*|scatter\w*|"
    r"all_to_all\w*|send|recv|isend|irecv|wait|monitored_barrier|_store_based_barrier|rendezvous|"
    r"init_process_group)$"
)
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


def quiet_for(ranks_dir: str, now: float, output: str = "") -> Optional[float]:
    """Seconds since any rank last wrote to its log (None: no rank file yet).

    Without per-rank files (the local scheduler's one combined log), the ``output`` file's.
    """
    from torchhpc.schedulers.logs import last_writes

    times = [t for t, _node in last_writes(ranks_dir).values()] if os.path.isdir(ranks_dir) else []
    if not times and output:
        try:
            times = [os.stat(output).st_mtime]
        except OSError:
            pass
    return max(0.0, now - max(times)) if times else None


def _environ(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep:
            out[k.decode(errors="replace")] = v.decode(errors="replace")
    return out


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
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        env = _environ(int(name))
        if "RANK" not in env or any(env.get(k) != v for k, v in match.items()):
            continue
        if not _is_python(int(name)) or not env["RANK"].isdigit():
            continue
        rank = int(env["RANK"])
        # the rank's own process, not a parent that carries the same variables (keep the newest)
        if rank not in found or int(name) > found[rank]:
            found[rank] = int(name)
    return found


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
                done = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30)
                frames = parse_py_spy(done.stdout)
                if not frames:
                    error = (done.stderr.strip().splitlines() or ["py-spy read no stack"])[-1]
            except (OSError, subprocess.TimeoutExpired) as e:
                error = f"py-spy failed: {e}"
        out.append(RankStack(rank, host, pid, cpu, frames, error))
    return out


def collective(frames: Sequence[tuple[str, str, int]]) -> str:
    """The torch.distributed call a stack waits in (a peer is late), or "" when it is in the user's own code."""
    return next((fn for fn, path, _ln in frames if _COLLECTIVES.match(fn) and "torch/distributed" in path), "")


def in_collective(frames: Sequence[tuple[str, str, int]]) -> bool:
    return bool(collective(frames))


def user_frame(frames: Sequence[tuple[str, str, int]]) -> str:
    """The innermost frame outside installed packages: where the user's code is, file:line."""
    for _fn, path, line in frames:
        if "site-packages" in path or "dist-packages" in path or path.startswith("<"):
            continue
        return f"{path}:{line}"
    return ""


@dataclass(frozen=True)
class HangVerdict:
    culprits: tuple[int, ...]
    waiting: tuple[int, ...]
    stacks: tuple[RankStack, ...] = field(default=())
    note: str = ""

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def culprit(stacks: Sequence[RankStack]) -> HangVerdict:
    """The ranks not in a collective while the others wait in one (all of them when no stack was read)."""
    waiting = tuple(s.rank for s in stacks if s.frames and in_collective(s.frames))
    others = tuple(s.rank for s in stacks if s.rank not in waiting)
    note = ""
    if not any(s.frames for s in stacks):
        note = next((s.error for s in stacks if s.error), "no stack could be read")
    elif not others:
        note = "every rank waits in a collective: look for a mismatched collective (order or size) or a network stall"
    return HangVerdict(others, waiting, tuple(stacks), note)


def render(v: HangVerdict, quiet_s: float) -> list[str]:
    """The hang's lines for the user: culprit, its host and file:line, what the others do."""
    from torchhpc.schedulers.logs import format_ranks

    by_rank = {s.rank: s for s in v.stacks}
    lines = [f"torchhpc: hang: no rank printed for {quiet_s:.0f}s and no rank used CPU"]
    for r in v.culprits[:4]:
        s = by_rank[r]
        where = user_frame(s.frames)
        top = s.frames[0][0] if s.frames else ""
        lines.append(f"torchhpc: hang: rank {r} on {s.host} is not in a collective" + (f": {top} at {where}" if where else ""))
        for fn, path, ln in s.frames[:6]:
            lines.append(f"    {fn} ({path}:{ln})")
    if v.waiting:
        calls = sorted({collective(by_rank[r].frames) for r in v.waiting})
        lines.append(f"torchhpc: hang: ranks {format_ranks(v.waiting)} wait in " + ", ".join(calls))
    if v.note:
        lines.append(f"torchhpc: hang: {v.note}")
    return lines


def save(job_dir: str, v: HangVerdict, quiet_s: float) -> str:
    path = os.path.join(job_dir, HANG_FILE)
    with open(path, "w") as f:
        json.dump({"quiet_s": quiet_s, **v.to_json()}, f, indent=1)
    return path


def load(job_dir: str) -> Optional[dict[str, object]]:
    try:
        with open(os.path.join(job_dir, HANG_FILE)) as f:
            d = json.load(f)
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) else None


def probe_job(
    here: bool, job_id: str, nnodes: int, runner: Optional[Runner] = None, notes: Optional[list[str]] = None,
    nodelist: str = "",
) -> list[RankStack]:
    """Every node's probe for one job: through ``srun --overlap`` once per node (Slurm), or here (local).

    ``runner`` is the scheduler's own command runner (its environment names the cluster); ``nodelist``
    names the nodes to probe (the in-allocation supervisor's step nodes), else any ``nnodes`` of the job.
    """
    if here:  # the local scheduler's ranks are this machine's processes
        return probe({"TORCHELASTIC_RUN_ID": f"local-{job_id}"}, "localhost")
    argv = ["srun", "--overlap", f"--jobid={job_id}", f"--nodes={nnodes}", f"--ntasks={nnodes}",
            "--ntasks-per-node=1", "--kill-on-bad-exit=0", *([f"--nodelist={nodelist}"] if nodelist else []), sys.executable, "-m", "torchhpc.schedulers.hang",
            f"SLURM_JOB_ID={job_id}"]
    done = (runner or Runner()).run(argv, check=False, timeout=120)
    if done.returncode != 0 or not done.stdout.strip():
        detail = done.stderr.strip().splitlines()
        raise RuntimeError(f"the per-node probe ({' '.join(argv[:6])} ...) answered {done.returncode}: "
                           + (detail[-1] if detail else "no output"))
    if notes is not None:
        notes.extend(ln if ln.startswith("torchhpc: hang:") else f"torchhpc: hang: probe: {ln}"
                     for ln in done.stderr.splitlines() if ln.strip())
    out = []
    for line in done.stdout.splitlines():
        try:
            d = json.loads(line)
        except ValueError:
            continue
        d["frames"] = tuple(tuple(f) for f in d.get("frames", ()))
        out.append(RankStack(**d))
    return out


class HangWatch:
    """Called on every poll of a running job: after ``timeout`` quiet seconds, probe, judge, act once."""

    def __init__(self, here: bool, job_id: str, timeout: float, on_hang: str, ranks_dir: str, job_dir: str,
                 nnodes: Callable[[], int], act: Callable[[str], None], say: Callable[[str], None],
                 runner: Optional[Runner] = None, output: str = "") -> None:
        self.here, self.job_id, self.timeout, self.on_hang = here, job_id, timeout, on_hang
        self.ranks_dir, self.job_dir, self.nnodes = ranks_dir, job_dir, nnodes
        self.act, self.say, self.runner, self.output = act, say, runner, output
        self.fired = False
        self._next_probe = 0.0

    def check(self, state: str, now: Optional[float] = None) -> Optional[HangVerdict]:
        if self.fired or state != "RUNNING":
            return None
        now = time.time() if now is None else now
        quiet = quiet_for(self.ranks_dir, now, self.output)
        if quiet is None or quiet < self.timeout or now < self._next_probe:
            return None
        notes: list[str] = []
        try:
            stacks = probe_job(self.here, self.job_id, self.nnodes(), self.runner, notes)
        except (RuntimeError, OSError, TorchHPCError) as e:
            self.say(f"torchhpc: hang: probe failed: {e}")
            stacks = []
        for n in notes:
            self.say(n)
        busy = [s.rank for s in stacks if s.cpu_s >= 0.1]
        if not stacks or busy:  # silent but computing (or gone): not a hang; look again later
            self._next_probe = now + max(10.0, self.timeout / 2)
            return None
        verdict = culprit(stacks)
        self.fired = True
        for line in render(verdict, quiet):
            self.say(line)
        saved = save(self.job_dir, verdict, quiet) if os.path.isdir(self.job_dir) else ""
        self.say(f"torchhpc: hang: {self.on_hang} the job" + (f"; diagnosis saved in {saved}" if saved else ""))
        self.act(self.on_hang)
        return verdict


def _main(argv: Sequence[str]) -> int:
    """``python -m torchhpc.schedulers.hang KEY=VALUE...``: probe this node, print JSON lines."""
    match = dict(a.split("=", 1) for a in argv if "=" in a)
    host = os.environ.get("SLURMD_NODENAME") or os.uname().nodename.split(".")[0]
    if "SLURM_JOB_ID" in match and os.environ.get("SLURMD_NODENAME"):
        match["SLURMD_NODENAME"] = os.environ["SLURMD_NODENAME"]  # /proc may show other nodes' ranks
    stacks = probe(match, host)
    for s in stacks:
        print(json.dumps(asdict(s)), flush=True)
    if not stacks:  # said on stderr, which the watch passes on: a node with no rank is worth knowing
        print(f"torchhpc: hang: no rank process of {match} found on {host}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
