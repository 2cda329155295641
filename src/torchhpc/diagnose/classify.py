"""A rank's own lines and a launcher's reports, read: the class of a failure and who ended first.

:mod:`~torchhpc.diagnose.verdict` weighs these with the scheduler's accounting into one verdict;
the supervisors (:mod:`torchhpc.supervisor`) read one attempt's lines with :func:`classify_text`
to decide whether a restart can help. ``CLASSES`` is the vocabulary both speak.

Pure: lines in, classes and ``(rank, host, own end)`` events out.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterable, Mapping, Sequence
from typing import Optional

from torchhpc.jobdir.logs import Line, parse_ranks
from torchhpc.jobdir.tracebacks import SYNTAX_FILE, compile_error_end

__all__ = ["CLASSES", "classify_text", "first_cause", "launcher_events", "native_crashes", "node_failure_words",
           "time_limit_words"]

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
    "time-limit": ("the job reached its time limit", "ask for more --time, or checkpoint on the warning: --signal-before and "
                   "torchhpc.dist.should_stop() (docs/nothing-lost.md)"),
    "preempted": ("the job was preempted", "rerun with --requeue so a preempted job comes back by itself"),
    "hang": ("ranks stopped making progress", "see the stacks above; the culprit is the rank not in a collective"),
    "network": (
        "a rendezvous, NCCL or network error",
        "check the interface and fabric: torchhpc net check (NCCL_DEBUG=INFO shows what NCCL picked)",
    ),
    "environment": ("the environment does not match the program (import error, wrong torch, a command not there)",
                    "check the venv or container: torchhpc doctor"),
    "gpu-assignment": (
        "ranks and GPUs do not match (a rank bound to a GPU that is not there, or two ranks on one GPU)",
        "one rank per visible GPU (--nproc-per-node = GPUs per node); `torchhpc env` shows what each rank sees",
    ),
    "collective-mismatch": (
        "the ranks called different collectives, or passed tensors of different sizes",
        "make every rank call the same collectives in the same order with the same shapes",
    ),
    "no-progress": (
        "restarts never advanced the checkpoint: the supervisor ended the job (a restart storm)",
        "fix what ended each attempt (the last one's verdict is above; `torchhpc events {job}` shows every attempt), "
        "or make the program save where --checkpoint-dir looks",
    ),
    "cancelled": ("the job was cancelled (who cancelled it is not recorded)", "nothing to fix: the job was cancelled"),
    "lost-peer": ("a rank lost its peer, and no rank shows why", "{logs} of every rank; the one that died left no traceback"),
    "unknown": ("no evidence names a cause", "read {logs}"),
}

_SIGNALS = {int(s): s.name for s in signal.Signals}

# Evidence in one rank's own lines, strongest first. Each: (class, pattern).
_RANK_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("cuda-oom", re.compile(r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory|HIP out of memory")),
    ("host-oom", re.compile(r"oom[-_]kill|Out of memory: Killed process|MemoryError")),
    # "python: No module named x" is `python -m x`'s own report of a missing module (no traceback)
    # bash's words when the task shim's exec finds no such command on the node (exit 127): "boot/task.sh: line 100:
    # exec: nosuchcmd: not found", "...: /opt/x/cmd: No such file or directory"
    ("environment", re.compile(r"ModuleNotFoundError|ImportError|: No module named |undefined symbol|GLIBC_\S+ not found|"
                               r"version mismatch|/task\.sh: line \d+: (?:exec: )?\S+: (?:not found|No such file or "
                               r"directory|Permission denied)")),
    # Before network: NCCL reports two ranks on one GPU as an NCCL error, but no link is at fault.
    (
        "gpu-assignment",
        # the last: torchhpc's own refusal (thd.init, before NCCL starts), printed as "Error: ..." and "HINT: ..."
        re.compile(r"Duplicate GPU detected|device_id cuda:\d+ is out of range|invalid device ordinal|No CUDA GPUs are available|"
                   r"NCCL needs one GPU per rank"),
    ),
    (
        "network",
        re.compile(
            r"NCCL error|ncclSystemError|ncclInternalError|ncclUnhandledCudaError|ncclRemoteError|NCCL WARN|"
            r"RendezvousTimeoutError|RendezvousConnectionError|DistNetworkError|DistStoreError|"
            r"Socket Timeout|timed out after|Watchdog caught collective operation timeout|No route to host|"
            r"Connection refused|Address already in use"
        ),
    ),
    # gloo's words when a peer's message has another size than this rank's call expects
    ("collective-mismatch", re.compile(r"Received data size doesn't match expected size|distributed collective mismatch")),
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
# Frames that are not the user's: installed packages, the interpreter's own library, frozen modules
_NOT_USER = re.compile(r"/(?:site|dist)-packages/|/lib(?:64)?/python\d+(?:\.\d+)?/|^<")


def user_file(path: str) -> bool:
    """Whether a traceback's file is the user's own (not the stdlib's, an installed package's, or frozen)."""
    return not _NOT_USER.search(path)

# Launchers' own reports of a task's end.
_SRUN_TASK = re.compile(r"^srun: error: (\S+): tasks? ([\d,\-]+): (.+?)\s*$")
# srun's words for a task a signal ended -> the signal
_SRUN_SIGNALS = {"Aborted": "SIGABRT", "Segmentation fault": "SIGSEGV", "Killed": "SIGKILL", "Bus error": "SIGBUS",
                 "Floating point exception": "SIGFPE", "Illegal instruction": "SIGILL"}
_MPI_SIGNAL = re.compile(r"process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+)")
_MPI_EXIT_NAME = re.compile(r"Process name: \[\[\d+,\d+\],(\d+)\]")
_MPI_EXIT_CODE = re.compile(r"^\s*Exit code:\s*(-?\d+)")
_LOCAL_END = re.compile(r"rank (\d+) (?:exited with code (-?\d+)|was killed by signal (\d+))")
_SRUN_LABEL = re.compile(r"^\s*\d+: ")
_TR_ROOT = re.compile(r"^Root Cause \(first observed failure\):")
_TR_FIELD = re.compile(r"^\s*(time|host|rank|exitcode)\s*:\s*(.*?)\s*$")


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
    for i, text in enumerate(texts):
        s = text.strip()
        end = compile_error_end(texts, i) if not tb_last and not in_tb else -1
        if end >= 0:  # a compile report: the file and line that do not compile
            m = SYNTAX_FILE.match(text)
            tb_last, where = texts[end].strip(), f"{m.group(1)}:{m.group(2)}" if m else ""
            continue
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
                user = [fr for fr in frames if user_file(fr.rsplit(":", 1)[0])]
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


def first_cause(ranks: Iterable[tuple[int, Sequence[str]]]) -> tuple[str, Optional[int], str]:
    """(class, rank, error line) of the first rank, in the order given, whose lines show a cause;
    ("lost-peer", None, "") when the only evidence is lost peers, else ("unknown", None, "").
    The supervisors read one attempt's lines with it to decide whether a restart can help."""
    lost = False
    for rank, texts in ranks:
        klass, error, _where = classify_text(texts)
        if klass == "lost-peer":
            lost = True
        elif klass:
            return klass, rank, error
    return ("lost-peer" if lost else "unknown"), None, ""


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
            if own.startswith("exit ") or what in _SRUN_SIGNALS:
                end = own if own.startswith("exit ") else _SRUN_SIGNALS[what]
                events += [(task, m.group(1), end) for task in parse_ranks(m.group(2))]
            elif what == "Terminated":
                events += [(task, m.group(1), "SIGTERM") for task in parse_ranks(m.group(2))]
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


def time_limit_words(job_lines: Sequence[str]) -> Optional[tuple[str, str]]:
    """What the batch script said of the stop protocol (schedulers/slurm/requeue.py): when the ranks were asked
    to stop, and whether they did (summary, next step); None without its lines: the class's own words stand."""
    asked = next((m.group(1) for t in job_lines for m in [re.search(r"time-limit at (\S+): asking every rank", t)] if m), "")
    if asked and any("its work is unfinished" in t for t in job_lines):
        return (f"the ranks were asked to stop at {asked} (the time-limit warning), checkpointed and stopped; the job "
                "was not requeued, so its work is unfinished", "submit it again to resume from its checkpoint, or give "
                "it --requeue with more --max-requeues, or more --time")
    if asked:
        return (f"the job reached its time limit: the ranks were asked to stop at {asked} (the warning) and none "
                "stopped before the limit", "call torchhpc.dist.should_stop() at each step and checkpoint when it "
                "says so (docs/nothing-lost.md), or ask for more --time")
    return None


def node_failure_words(attempts: Sequence[Mapping[str, object]]) -> Optional[tuple[str, str]]:
    """A supervised job's node failure in the supervisor's own record (attempts.json): which nodes it lost and
    why the job ended, and the rerun that leaves them out (summary, next step); None without that record."""
    last = attempts[-1] if attempts else {}
    lost = [str(h) for h in last.get("excluded") or ()]  # type: ignore[attr-defined]
    if last.get("class") != "node-failure" or not lost:
        return None
    detail = str(last.get("detail") or "")
    if last.get("batch_host"):  # the supervisor's own node: its watch on another node ended the job
        return (f"{detail} (the supervisor's watch, attempts.json)",
                f"submit it again; it runs without {', '.join(lost)} if you add --exclude {','.join(lost)}")
    said = f"{', '.join(lost)} lost ({detail or 'stopped answering'})"
    return (f"{said}; no restart left on healthy nodes (the supervisor's attempts.json)",
            f"rerun with --exclude {','.join(lost)}, or more --spares (with --requeue, torchhpc excludes them itself)")
