"""Why a job failed, from the evidence it left: a verdict instead of "read the logs".

A failed distributed job leaves three kinds of evidence, and none alone names the culprit:

* **each rank's own log** (``ranks/rank-N@NODE.log``): the traceback of the rank that raised,
  and the ``Connection closed by peer`` tracebacks of every rank that only lost it; native
  crashes (``terminate called ...``, ``Segmentation fault``) and CUDA/NCCL messages;
* **the launcher's messages** in the scheduler output: srun's ``task 3: Aborted``, torchrun's
  ``Root Cause (first observed failure)`` block, mpirun's ``process rank 3 ... exited on signal
  6``. They carry the rank's *own* exit status or signal, which the job's exit code hides (srun
  and torchrun report the kill of the other ranks: 143 or 1);
* **the scheduler's accounting**: ``TIMEOUT``, ``OUT_OF_MEMORY``, ``NODE_FAIL``, ``PREEMPTED``,
  ``CANCELLED`` (and the batch step's ``*** ... DUE TO TIME LIMIT ***`` lines).

:func:`diagnose` weighs them in that order of authority: the scheduler's verdict on the whole
job first (a time limit explains every rank's death), then the launcher's first failed rank,
then the earliest rank whose own log shows a root cause (by when its file was last written).
Ranks whose only evidence is a lost peer are counted as consequences, not listed.

Pure: lines and facts in, :class:`Verdict` out. The CLI (``torchhpc diagnose``) gathers them.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Optional

from torchhpc.jobdir.logs import Line, format_ranks, parse_ranks

__all__ = [
    "CLASSES", "Evidence", "RankFailure", "Verdict", "classify_text", "diagnose", "gather", "launcher_events",
    "native_crashes",
]

# class -> (what it means, one suggested next step). The keys are the verdict's vocabulary.
CLASSES: dict[str, tuple[str, str]] = {
    "user-exception": ("a Python exception in the program", "fix the exception above; {logs} shows the rank's whole output"),
    "native-crash": (
        "a native crash (abort or segfault in C++: torch, NCCL or an extension)",
        "{logs} shows the rank's last lines; rerun with TORCH_SHOW_CPP_STACKTRACES=1 for the C++ stack",
    ),
    "cuda-oom": ("CUDA out of memory", "lower the batch size or use activation checkpointing / bf16"),
    "host-oom": ("host out of memory (the kernel's OOM killer)", "ask for more memory: --mem (or fewer ranks per node)"),
    "node-failure": ("a node failed", "rerun with --exclude {host} (with --requeue, torchhpc excludes it itself)"),
    "time-limit": ("the job reached its time limit", "ask for more --time, or checkpoint on the warning signal (docs/stop.md)"),
    "preempted": ("the job was preempted", "rerun with --requeue so a preempted job comes back by itself"),
    "hang": ("ranks stopped making progress", "see the stacks above; the culprit is the rank not in a collective"),
    "network": (
        "a rendezvous, NCCL or network error",
        "check the interface and fabric: torchhpc net check (NCCL_DEBUG=INFO shows what NCCL picked)",
    ),
    "environment": ("the environment does not match the program (import error, wrong torch)", "check the venv or container: torchhpc doctor"),
    "cancelled": ("cancelled by a user", "nothing to fix: someone ran scancel/cancel"),
    "lost-peer": ("a rank lost its peer, and no rank shows why", "{logs} of every rank; the one that died left no traceback"),
    "unknown": ("no evidence names a cause", "read {logs}"),
}

_SIGNALS = {int(s): s.name for s in signal.Signals}

# Evidence in one rank's own lines, strongest first. Each: (class, pattern).
_RANK_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("cuda-oom", re.compile(r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory|HIP out of memory")),
    ("host-oom", re.compile(r"oom[-_]kill|Out of memory: Killed process|MemoryError")),
    ("environment", re.compile(r"ModuleNotFoundError|ImportError|undefined symbol|GLIBC_\S+ not found|version mismatch")),
    (
        "network",
        re.compile(
            r"NCCL error|ncclSystemError|ncclInternalError|ncclUnhandledCudaError|ncclRemoteError|NCCL WARN|"
            r"RendezvousTimeoutError|RendezvousConnectionError|DistNetworkError|DistStoreError|"
            r"Socket Timeout|timed out after|Watchdog caught collective operation timeout|No route to host|"
            r"Connection refused|Address already in use"
        ),
    ),
    ("native-crash", re.compile(r"terminate called|Segmentation fault|Fatal Python error|core dumped|SIGSEGV|SIGABRT|Aborted")),
)
# A rank that only saw its peer die: a consequence, not a cause.
_LOST_PEER = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|remote worker crashing|"
    r"SignalException|got signal: 15|Signal 15 \(SIGTERM\)|Terminated|ProcessGroupGloo.*closed|peer.*(?:died|exited)"
)
_TB_START = "Traceback (most recent call last):"
_TORCH_PREFIX = re.compile(r"^\[rank\d+\]: ?")  # torch prefixes its ranks' tracebacks itself
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+)')

# Scheduler-wide verdicts (sacct State, or the batch step's banner).
_JOB_STATES = {
    "TIMEOUT": "time-limit",
    "OUT_OF_MEMORY": "host-oom",
    "NODE_FAIL": "node-failure",
    "PREEMPTED": "preempted",
    "CANCELLED": "cancelled",
    "DEADLINE": "time-limit",
}
_BANNER = re.compile(r"\*\*\* (?:JOB|STEP) \S+ ON (\S+) CANCELLED AT \S+(?: DUE TO ([A-Z ]+?))? \*\*\*")
_BANNER_CLASS = {"TIME LIMIT": "time-limit", "PREEMPTION": "preempted", "NODE FAILURE": "node-failure"}
_OOM_EVENT = re.compile(r"Detected \d+ oom[-_]kill event|oom[-_]kill event")

# Launchers' own reports of a task's end.
_SRUN_TASK = re.compile(r"^srun: error: (\S+): tasks? ([\d,\-]+): (.+?)\s*$")
_MPI_SIGNAL = re.compile(r"process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+)")
_MPI_EXIT_NAME = re.compile(r"Process name: \[\[\d+,\d+\],(\d+)\]")
_MPI_EXIT_CODE = re.compile(r"^\s*Exit code:\s*(-?\d+)")
_LOCAL_END = re.compile(r"rank (\d+) (?:exited with code (-?\d+)|was killed by signal (\d+))")
_SRUN_LABEL = re.compile(r"^\s*\d+: ")
_TR_ROOT = re.compile(r"^Root Cause \(first observed failure\):")
_TR_FIELD = re.compile(r"^\s*(time|host|rank|exitcode)\s*:\s*(.*?)\s*$")


@dataclass(frozen=True)
class RankFailure:
    """One rank's end, as far as the evidence says."""

    rank: int
    host: str = ""
    klass: str = "unknown"
    exit: str = ""  # "exit 1", "SIGABRT", ... (the rank's own, not the launcher's)
    error: str = ""  # the exception line or the crash message
    where: str = ""  # innermost frame in the user's code: file:line
    log: str = ""
    when: float = 0.0  # sort key: earlier failed first
    consequence: bool = False


@dataclass(frozen=True)
class Evidence:
    """What :func:`diagnose` reads. All optional: it says what it could not see."""

    lines: Sequence[Line] = ()
    failed_at: Mapping[int, float] = field(default_factory=dict)  # rank -> its log file's last write
    rank_logs: Mapping[int, str] = field(default_factory=dict)  # rank -> path of its own log
    nodes: Mapping[int, str] = field(default_factory=dict)  # rank -> host
    launcher: str = ""
    nproc_per_node: int = 1
    state: str = ""  # the scheduler's final state (sacct State)
    exit_code: Optional[int] = None  # the job's exit code
    job: str = ""  # "slurm:123", for the suggested commands
    hang: Optional[Mapping[str, object]] = None  # the hang watch's saved diagnosis (hang.json)
    local: bool = False  # the local scheduler: its supervisor's reason names the rank that ended first


@dataclass(frozen=True)
class Verdict:
    klass: str
    summary: str
    first: Optional[RankFailure]
    consequences: tuple[int, ...]
    next_step: str
    job: str = ""
    state: str = ""
    exit_code: Optional[int] = None
    evidence: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.klass == "none"

    def render(self) -> str:
        """At most 8 lines: the verdict, the first failed rank, the consequences, the next step."""
        if self.ok:
            return f"diagnosis: {self.summary}\n"
        out = [f"diagnosis: {self.klass} — {self.summary}"]
        f = self.first
        if f is not None:
            at = f" on {f.host}" if f.host else ""
            own = f", {f.exit}" if f.exit else ""
            out.append(f"  {'culprit' if self.klass == 'hang' else 'first failed'}: rank {f.rank}{at}{own}")
            if f.error:
                out.append(f"  {f.error[:200]}")
            if f.where:
                out.append(f"  at {f.where}")
            if f.log:
                out.append(f"  log: {f.log}")
        if self.consequences and self.klass == "hang":
            out.append(f"  ranks {format_ranks(self.consequences)} waited for it in a collective")
        elif self.consequences:
            out.append(f"  then ranks {format_ranks(self.consequences)} failed as a consequence (lost their peer, or stopped by the launcher)")
        out.append(f"  next: {self.next_step}")
        return "\n".join(out[:8]) + "\n"

    def to_json(self) -> dict[str, object]:
        d = asdict(self)
        d["class"] = d.pop("klass")
        if self.first is not None:
            d["first"]["class"] = d["first"].pop("klass")
        d["consequences"] = list(self.consequences)
        d["evidence"] = list(self.evidence)
        return d


def _signame(num: int) -> str:
    return _SIGNALS.get(num, f"signal {num}")


def classify_text(texts: Sequence[str]) -> tuple[str, str, str]:
    """(class, error line, innermost user frame) of one rank's lines; class "" when nothing is there.

    A traceback's exception line is the error; its class is the strongest pattern found in the
    rank's lines (a CUDA OOM raises a Python exception, but its class is cuda-oom). A traceback
    whose only cause is a lost peer gives "lost-peer".
    """
    error, where, klass = "", "", ""
    tb_last = ""
    in_tb = False
    frames: list[str] = []
    texts = [_TORCH_PREFIX.sub("", t, count=1) for t in texts]
    for text in texts:
        s = text.strip()
        if s == _TB_START:
            in_tb, frames = True, []
            continue
        if in_tb:
            m = _FRAME.match(text)
            if m:
                frames.append(f"{m.group(1)}:{m.group(2)}")
                continue
            if text[:1] in (" ", "\t") or not s:
                continue
            in_tb = False
            if not tb_last:  # the first traceback is the cause; later ones are chained handling
                tb_last = s
                user = [fr for fr in frames if "/site-packages/" not in fr and "/dist-packages/" not in fr
                        and not fr.startswith("<frozen")]
                where = (user or frames or [""])[-1]
    for name, pat in _RANK_PATTERNS:
        hit = next((t.strip() for t in texts if pat.search(t)), "")
        if hit:
            klass = name
            error = tb_last if (tb_last and pat.search(tb_last)) else hit
            break
    if not klass and tb_last:
        klass = "lost-peer" if _LOST_PEER.search(tb_last) else "user-exception"
        error = tb_last
    elif not klass and any(_LOST_PEER.search(t) for t in texts):
        klass = "lost-peer"
        error = next(t.strip() for t in texts if _LOST_PEER.search(t))
    return klass, error, where


def native_crashes(lines: Sequence[Line]) -> list[tuple[int, str]]:
    """(rank, line) of each rank's first native-crash message, for ranks that printed no traceback."""
    pattern = dict(_RANK_PATTERNS)["native-crash"]
    out: dict[int, str] = {}
    for ln in lines:
        if ln.rank is not None and ln.rank not in out and pattern.search(ln.text):
            out[ln.rank] = ln.text
    return sorted(out.items())


def launcher_events(
    texts: Sequence[str], launcher: str, nproc_per_node: int = 1, local: bool = False
) -> list[tuple[int, str, str]]:
    """(rank, host, own end) in the order the launcher reported them; "" ends are successes.

    srun labels tasks; under torchrun a task is a node's agent, so its lines name no rank and
    torchrun's own "Root Cause" block is read instead (its time field orders the agents).
    """
    from torchhpc.launchers import LAUNCHERS

    # a task is a node's agent (torchrun): srun's task lines then name agents, not ranks
    agents = launcher in LAUNCHERS and LAUNCHERS[launcher].per_node
    events: list[tuple[int, str, str]] = []
    roots: list[tuple[str, int, int, str, str]] = []
    texts = [_SRUN_LABEL.sub("", t, count=1) for t in texts]  # srun --label's "3: " on raw output
    i = 0
    while i < len(texts):
        t = texts[i]
        m = _SRUN_TASK.match(t)
        if m and not agents:
            what = m.group(3)
            own = what.replace("Exited with exit code ", "exit ")
            if own.startswith("exit ") or what in ("Aborted", "Segmentation fault", "Killed", "Bus error",
                                                  "Floating point exception", "Illegal instruction"):
                for task in parse_ranks(m.group(2)):
                    events.append((task, m.group(1), own if own.startswith("exit ") else _own_signal(what)))
            elif what == "Terminated":
                for task in parse_ranks(m.group(2)):
                    events.append((task, m.group(1), "SIGTERM"))
        m2 = _MPI_SIGNAL.search(t)
        if m2:
            events.append((int(m2.group(1)), m2.group(2), _signame(int(m2.group(3)))))
        m3 = _MPI_EXIT_NAME.search(t)
        if m3 and i + 1 < len(texts):
            m4 = _MPI_EXIT_CODE.match(texts[i + 1])
            if m4:
                events.append((int(m3.group(1)), "", f"exit {m4.group(1)}"))
        m5 = _LOCAL_END.search(t) if local else None  # the local supervisor's own words
        if m5:
            own = f"exit {m5.group(2)}" if m5.group(2) is not None else _signame(int(m5.group(3)))
            events.append((int(m5.group(1)), "", own))
        if _TR_ROOT.match(t.strip()):
            fields: dict[str, str] = {}
            j = i + 1
            while j < len(texts) and j < i + 10:
                f = _TR_FIELD.match(texts[j])
                if f:
                    fields[f.group(1)] = f.group(2)
                j += 1
            if "rank" in fields:
                rank = int(fields["rank"].split()[0])
                code = fields.get("exitcode", "").split()[0] if fields.get("exitcode") else ""
                own = ""
                if code.lstrip("-").isdigit():
                    n = int(code)
                    own = _signame(-n) if n < 0 else f"exit {n}"
                roots.append((fields.get("time", ""), i, rank, fields.get("host", ""), own))
        i += 1
    roots.sort()  # torchrun's time field (to the second), then the output's order
    return [(r, h, o) for _t, _i, r, h, o in roots] + events


def _own_signal(what: str) -> str:
    return {"Aborted": "SIGABRT", "Segmentation fault": "SIGSEGV", "Killed": "SIGKILL", "Bus error": "SIGBUS",
            "Floating point exception": "SIGFPE", "Illegal instruction": "SIGILL"}.get(what, what)


def diagnose(ev: Evidence) -> Verdict:
    """The verdict for one job from its evidence (see the module docstring for the weighing)."""
    per_rank: dict[int, list[str]] = {}
    job_lines: list[str] = []
    for ln in ev.lines:
        if ln.rank is None:
            job_lines.append(ln.text)
        else:
            per_rank.setdefault(ln.rank, []).append(ln.text)
    logs_cmd = f"`torchhpc logs {ev.job}`" if ev.job else "`torchhpc logs JOB`"
    seen: list[str] = []
    if ev.hang:
        return _hang_verdict(ev)

    # 1. the scheduler's verdict on the whole job
    job_class = _JOB_STATES.get(ev.state.split()[0] if ev.state else "", "")
    banner_host = ""
    for t in job_lines + [x for texts in per_rank.values() for x in texts]:
        m = _BANNER.search(t)
        if m and m.group(2) and not job_class:
            job_class = _BANNER_CLASS.get(m.group(2).strip(), job_class)
            banner_host = m.group(1)
        if _OOM_EVENT.search(t) and not job_class:
            job_class = "host-oom"
    if ev.state:
        seen.append(f"scheduler state {ev.state}" + (f", exit code {ev.exit_code}" if ev.exit_code is not None else ""))

    # 2. each rank's own evidence
    failures: dict[int, RankFailure] = {}
    for rank, texts in per_rank.items():
        klass, error, where = classify_text(texts)
        if not klass:
            continue
        failures[rank] = RankFailure(
            rank=rank, host=ev.nodes.get(rank, ""), klass=klass, error=error, where=where,
            log=ev.rank_logs.get(rank, ""), when=ev.failed_at.get(rank, float("inf")),
            consequence=klass == "lost-peer",
        )
    if failures:
        seen.append(f"{len(failures)} rank log(s) with an error")

    # 3. the launcher's report: the rank's own end status, and who went first
    events = launcher_events(job_lines, ev.launcher, ev.nproc_per_node, local=ev.local)
    order: list[int] = []
    stopped: set[int] = set()  # ranks the launcher ended (SIGTERM) after another failed: consequences
    for rank, host, own in events:
        if own == "SIGTERM":
            stopped.add(rank)
        if own in ("SIGTERM", "") or rank in order:
            continue
        order.append(rank)
        prev = failures.get(rank) or RankFailure(rank=rank, klass="unknown", log=ev.rank_logs.get(rank, ""),
                                                 when=ev.failed_at.get(rank, float("inf")))
        klass = prev.klass
        if own.startswith("SIG") and own not in ("SIGTERM", "SIGKILL") and klass in ("unknown", "lost-peer"):
            klass = "native-crash"
        if own == "SIGKILL" and klass in ("unknown", "lost-peer"):
            klass = "host-oom" if job_class == "host-oom" else "unknown"
        failures[rank] = replace(
            prev, host=prev.host or host or ev.nodes.get(rank, ""), klass=klass, exit=own,
            error=prev.error or (f"killed by {own}" if own.startswith("SIG") else ""), consequence=klass == "lost-peer",
        )
    if events:
        seen.append(f"{ev.launcher or 'launcher'} reported {len(events)} task end(s)")

    # the first failed rank: the launcher's first report of a cause, else the earliest log
    causes = [f for f in failures.values() if not f.consequence]
    first: Optional[RankFailure] = None
    for rank in order:
        if rank in failures and not failures[rank].consequence:
            first = failures[rank]
            break
    if first is None and causes:
        first = min(causes, key=lambda f: (f.when, f.rank))
    if first is None and failures:
        first = min(failures.values(), key=lambda f: (f.when, f.rank))

    klass = job_class or (first.klass if first else "")
    if not klass:
        if ev.state in ("COMPLETED", "") and ev.exit_code in (0, None):
            return Verdict("none", "no failure: the job completed", None, (), "", ev.job, ev.state, ev.exit_code,
                           tuple(seen))
        klass = "unknown"
    if job_class == "node-failure" and first is None and banner_host:
        first = RankFailure(rank=-1, host=banner_host, klass=klass)
    # every other rank of a failed job ended because of it: its launcher stopped it, or it lost its peer
    # (a rank stopped before it printed anything has only its log file, created at its start)
    others = set(failures) | stopped | set(ev.rank_logs)
    if ev.local:  # the local supervisor stops every other rank of the run when one fails, as srun does
        others |= set(range(ev.nproc_per_node))
    consequences = tuple(sorted(r for r in others if first is None or r != first.rank))
    meaning, step = CLASSES.get(klass, CLASSES["unknown"])
    if first is not None and first.rank >= 0:
        logs_cmd = f"`torchhpc logs {ev.job or 'JOB'} --rank {first.rank}`"
    step = step.format(logs=logs_cmd, host=(first.host if first and first.host else "NODE"))
    if job_class and first is not None and first.klass != job_class:
        # the scheduler ended the job; the ranks' errors are what that did to them
        consequences = tuple(sorted(others))
        first = None if job_class in ("time-limit", "cancelled", "preempted") else first
    return Verdict(klass, meaning, first, consequences, step, ev.job, ev.state, ev.exit_code, tuple(seen))


def _hang_verdict(ev: Evidence) -> Verdict:
    """The verdict from the hang watch's record: the culprit rank, its stack, the ranks that waited."""
    from torchhpc.diagnose.hang import user_frame

    h = ev.hang or {}
    stacks = {int(s["rank"]): s for s in h.get("stacks", ()) if isinstance(s, dict)}  # type: ignore[attr-defined]
    culprits = [int(r) for r in h.get("culprits", ())]  # type: ignore[attr-defined]
    waiting = tuple(sorted(int(r) for r in h.get("waiting", ())))  # type: ignore[attr-defined]
    first = None
    if culprits:
        s = stacks.get(culprits[0], {})
        frames = [tuple(f) for f in s.get("frames", ())]
        top = frames[0][0] if frames else ""
        first = RankFailure(
            rank=culprits[0], host=str(s.get("host", "")), klass="hang",
            error=f"not in a collective ({top})" if top else str(s.get("error", "")),
            where=user_frame(frames), log=ev.rank_logs.get(culprits[0], ""),  # type: ignore[arg-type]
        )
    meaning, step = CLASSES["hang"]
    quiet = h.get("quiet_s")
    summary = meaning + (f" for {float(quiet):.0f}s" if isinstance(quiet, (int, float)) else "")  # type: ignore[arg-type]
    if waiting:
        summary += "; the others wait in a collective"
    return Verdict("hang", summary, first, waiting, step, ev.job, ev.state, ev.exit_code, ("hang.json",))


def gather(scheduler: object, name: str, job_id: str) -> Evidence:
    """Collect a job's evidence: its record's log files and the scheduler's final state.

    ``scheduler`` is the scheduler object (``status`` and ``log_paths``); a scheduler that cannot
    answer leaves that part empty, and the verdict says what it saw.
    """
    import os

    from torchhpc.jobdir.logs import job_log, rank_files

    state, code, reason, hosts = "", None, "", ""
    try:
        st = scheduler.status(job_id)  # type: ignore[attr-defined]
        state, code, reason, hosts = st.state, st.exit_code, st.reason, st.nodes
    except Exception:  # the verdict works from the logs alone
        pass
    try:
        paths = scheduler.log_paths(job_id)  # type: ignore[attr-defined]
    except Exception:
        paths = []
    log = job_log(name, job_id, output=paths[0] if paths else None)
    if log is None:
        return Evidence(state=state, exit_code=code, job=f"{name}:{job_id}")
    files = rank_files(log.ranks_dir) if log.ranks_dir else {}
    lines = log.read(final=True)
    local = bool(getattr(scheduler, "runs_here", False))
    if local:  # the local supervisor says which rank ended first, in the job's reason
        lines = [*lines, Line(None, reason)] if reason else lines
    nodes = {r: n for r, (_p, n) in files.items()}
    if not nodes and hosts and "," not in hosts and "[" not in hosts:  # one node: every rank is on it
        nodes = {ln.rank: hosts for ln in lines if ln.rank is not None}
    from torchhpc.diagnose.hang import load as load_hang

    where = os.path.dirname(log.ranks_dir) if log.ranks_dir else os.path.dirname(log.output or "")
    hang = load_hang(where) if where else None
    return Evidence(
        hang=hang,
        lines=lines,
        failed_at=log.failure_order(),
        rank_logs={r: p for r, (p, _n) in files.items()},
        nodes=nodes,
        launcher=log.launcher,
        local=local,
        nproc_per_node=log.nproc_per_node,
        state=state,
        exit_code=code,
        job=f"{name}:{job_id}",
    )


def progress_lines(ranks_dir: str, now: float, quiet_after: float = 60.0) -> list[str]:
    """Per node, the seconds since each rank last wrote a line (its log file's last write).

    What a user reads before any hang timeout fires: the rank that went quiet first stands out.
    """
    from torchhpc.jobdir.logs import last_writes

    by_node: dict[str, list[str]] = {}
    for rank, (when, node) in sorted(last_writes(ranks_dir).items()):
        age = max(0.0, now - when)
        mark = " (quiet)" if age >= quiet_after else ""
        by_node.setdefault(node or "?", []).append(f"rank {rank} {age:.0f}s{mark}")
    return [f"  {node}: last output " + ", ".join(items) for node, items in sorted(by_node.items())]
