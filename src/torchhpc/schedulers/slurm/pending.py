"""Why a Slurm job is pending, from what Slurm says: squeue, sinfo, sacctmgr, and the job's scontrol record.

:func:`queries` names the calls one ``status`` makes, all at once (one round, run concurrently
by :func:`explain`): the partition's nodes (``sinfo``) and what each has left (``scontrol show
node``: a partly used node with room for the job fits it), its queue (``squeue``), and only where the
job's reason asks for them, the dependencies' states and the QOS or association limit
(``sacctmgr``). :func:`classify` is a pure function of their parsed output, unit-tested on
output recorded from the dev cluster (tests/data/slurm/pending/).

Nothing is guessed: the category comes from Slurm's reason, except that a request the partition
can never satisfy (more nodes than it has, a feature no node has, the partition down) is called
``never`` whatever the reason says; an action is given only where the evidence supports it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Optional

from torchhpc.core.hostlist import compress, expand
from torchhpc.core.proc import Runner
from torchhpc.core.units import counted
from torchhpc.schedulers.pending import Pending

__all__ = ["NodeRow", "QueueRow", "classify", "explain", "parse_nodes", "parse_queue", "queries"]

SINFO_FORMAT = "%P|%a|%l|%D|%N|%T|%c|%m|%f|%E"
SQUEUE_FORMAT = "%i|%T|%Q|%D|%C|%u|%q|%j|%N|%e|%r"
QOS_FORMAT = "Name,MaxTRESPerUser,MaxJobsPerUser,MaxSubmitJobsPerUser,MaxTRESPerJob,MaxWall,GrpTRES,GrpJobs"
ASSOC_FORMAT = "Account,User,Partition,MaxJobs,MaxSubmitJobs,MaxTRES,MaxWall,GrpTRES,GrpJobs"
_UNSET = ("", "(null)", "None", "N/A", "Unknown")
# Slurm reasons that say the request can never start as it stands.
_NEVER = {
    "PartitionDown": "partition {part} is down: no job in it starts until an administrator sets it up",
    "PartitionInactive": "partition {part} is inactive: no job in it starts",
    "PartitionNodeLimit": "it asks for more nodes than partition {part} allows",
    "PartitionTimeLimit": "its time limit is over partition {part}'s MaxTime",
    "BadConstraints": "no node can satisfy its constraints (--constraint, --mem, CPUs per node)",
    "DependencyNeverSatisfied": "a dependency can never be satisfied",
    "InvalidAccount": "its account is not valid here",
    "InvalidQOS": "its QOS is not valid here",
    "QOSNotAllowed": "its QOS is not allowed in partition {part}",
    "AccountNotAllowed": "its account is not allowed in partition {part}",
}
_AFTER = {"afterok": "ends successfully", "afterany": "ends", "afternotok": "fails", "after": "starts",
          "aftercorr": "'s matching task ends successfully"}
_HELD = ("JobHeldUser", "JobHeldAdmin", "launch failed requeued held")
_LIMIT = re.compile(r"^(QOS|Assoc)(Grp|Max)(\w+?)(PerUser|PerJob|PerAccount|PerNode)?Limit$")
# a limit reason's resource -> (the TRES name, or the job-count field's suffix)
_TRES = {"Node": "node", "Cpu": "cpu", "Mem": "mem", "GRES": "gres", "Billing": "billing"}


@dataclass(frozen=True)
class NodeRow:
    partition: str
    avail: str  # the partition's state: up, down, drain, inact
    max_time: str
    node: str
    state: str  # idle, mixed, allocated, drained, down*, ...
    cpus: int
    memory_mb: int
    features: tuple[str, ...]
    reason: str  # why a node is drained or down


@dataclass(frozen=True)
class QueueRow:
    job_id: str
    state: str
    priority: int
    nodes: int
    cpus: int
    user: str
    qos: str
    name: str
    nodelist: str
    end: str
    reason: str


def _int(text: str) -> int:
    m = re.match(r"\d+", text.strip())
    return int(m.group()) if m else 0


def parse_nodes(text: str) -> list[NodeRow]:
    rows = []
    for line in text.splitlines():
        p = line.split("|", 9)
        if len(p) < 10:
            continue
        feats = tuple(f for f in p[8].split(",") if f and f not in _UNSET)
        rows.append(NodeRow(p[0].rstrip("*"), p[1], p[2], p[4], p[5], _int(p[6]), _int(p[7]), feats,
                            "" if p[9] in ("none", *_UNSET) else p[9]))
    return rows


def parse_queue(text: str) -> list[QueueRow]:
    rows = []
    for line in text.splitlines():
        p = line.split("|", 10)
        if len(p) == 11:
            rows.append(QueueRow(p[0], p[1], _int(p[2]), _int(p[3]), _int(p[4]), p[5], p[6], p[7], p[8], p[9], p[10]))
    return rows


def dependencies(field: str) -> list[tuple[str, str, str]]:
    """``afterok:4(unfulfilled),afterany:5_1(failed)`` -> [(kind, job id, Slurm's mark)]."""
    return [(m.group(1), m.group(2), m.group(3) or "")
            for m in re.finditer(r"(\w+):(\d+(?:_\d+)?)(?:\+\d+)?(?:\((\w+)\))?", field or "")]


def queries(job: Mapping[str, str]) -> dict[str, list[str]]:
    """The calls that explain this pending job (its ``scontrol show job`` fields), by name; one round."""
    part = job.get("Partition", "")
    out = {
        "nodes": ["sinfo", "-h", "-N", "-p", part, "-o", SINFO_FORMAT],
        "queue": ["squeue", "-h", "-p", part, "-t", "PD,R,CG,CF,S", "-o", SQUEUE_FORMAT],
        # what a partly used (mixed) node has left: sinfo's -o has no allocated memory
        "use": ["scontrol", "show", "node", "-o"],
    }
    deps = [d for _k, d, _m in dependencies(job.get("Dependency", ""))]
    if deps:
        out["deps"] = ["squeue", "-h", "-t", "all", "-j", ",".join(deps), "-o", SQUEUE_FORMAT]
    if job.get("Reservation", "") not in _UNSET:
        out["reservation"] = ["scontrol", "show", "reservation", "-o", job["Reservation"]]
    m = _LIMIT.match(job.get("Reason", ""))
    if m and m.group(1) == "QOS" and job.get("QOS"):
        out["limit"] = ["sacctmgr", "-n", "-P", "show", "qos", job["QOS"], f"format={QOS_FORMAT}"]
    elif m:
        user = job.get("UserId", "").split("(")[0]
        out["limit"] = ["sacctmgr", "-n", "-P", "show", "assoc", "where", f"user={user}",
                        f"account={job.get('Account', '')}", f"format={ASSOC_FORMAT}"]
    if m:
        user = job.get("UserId", "").split("(")[0]
        out["mine"] = ["squeue", "-h", "-u", user, "-t", "R", "-o", SQUEUE_FORMAT]
    return out


def explain(runner: Runner, job: Mapping[str, str]) -> Pending:
    """Run :func:`queries` concurrently (one round), then :func:`classify`. A call that fails leaves its part empty."""
    calls = queries(job)

    def one(argv: list[str]) -> str:
        done = runner.run(argv, check=False, timeout=30)
        return done.stdout if done.returncode == 0 else ""

    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        answers = dict(zip(calls, pool.map(one, calls.values())))
    return classify(job, answers)


def _limit_fields(text: str, fmt: str) -> dict[str, str]:
    names = fmt.split(",")
    for line in text.splitlines():
        vals = line.split("|")
        if len(vals) == len(names):
            return {k: v for k, v in zip(names, vals) if v}
    return {}


def _tres(value: str, key: str) -> str:
    """``cpu=4,node=1`` -> the ``node`` item (``gres`` matches ``gres/gpu=...``)."""
    return next((item for item in value.split(",") if item.split("=")[0] == key or item.startswith(key + "/")), "")


def _amount(item: str) -> float:
    """``cpu=4`` -> 4, ``mem=23593M`` -> 23593 (MiB), ``mem=2G`` -> 2048."""
    m = re.search(r"=(\d+(?:\.\d+)?)([KMGT]?)", item)
    if not m:
        return 0.0
    return float(m.group(1)) * {"": 1, "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 ** 2}[m.group(2)]


def _requested_features(expr: str) -> Optional[list[str]]:
    """Features a plain ``a&b`` / ``a,b`` constraint needs (None: an expression too rich to check here)."""
    if not expr or expr in _UNSET:
        return []
    if re.search(r"[|\[\]*()!]", expr):
        return None
    return [f for f in re.split(r"[&,]", expr) if f]


def _never(job: Mapping[str, str], nodes: Sequence[NodeRow], asked: int) -> list[str]:
    """Evidence that the partition can never run the request as it stands (empty: none found)."""
    if not nodes:
        return []
    part = nodes[0].partition
    names = {n.node for n in nodes}
    why = []
    if nodes[0].avail not in ("up",):
        why.append(f"partition {part} is {nodes[0].avail.upper()}")
    if asked > len(names):
        why.append(f"it asks {asked} nodes; partition {part} has {len(names)}")
    feats = _requested_features(job.get("Features", ""))
    if feats:
        have = {f for n in nodes for f in n.features}
        missing = [f for f in feats if f not in have]
        if missing:
            why.append(f"no node in {part} has feature {', '.join(missing)} (features there: "
                       f"{', '.join(sorted(have)) or 'none'})")
    return why


def _fit(nodes: Sequence[NodeRow], job: Mapping[str, str]) -> list[NodeRow]:
    """The partition's nodes that have the job's features and CPUs per node."""
    feats = _requested_features(job.get("Features", "")) or []
    cpus = _int(job.get("MinCPUsNode", "1"))
    return [n for n in nodes if all(f in n.features for f in feats) and n.cpus >= cpus]


def _room(use: str, job: Mapping[str, str]) -> set[str]:
    """The nodes of ``scontrol show node -o`` with the CPUs and memory one node of the job needs free.

    CPUs per node: MinCPUsNode, or the job's CPUs over its nodes. Memory only where the job asks some
    (MinMemoryNode, MinMemoryCPU x CPUs): without it (MinMemoryNode=0) Slurm does not count memory.
    """
    nodes = max(1, _int(job.get("NumNodes", "1")))
    cpus = max(_int(job.get("MinCPUsNode", "1")), -(-_int(job.get("NumCPUs", "1")) // nodes))
    mem = _amount("=" + job.get("MinMemoryNode", "0")) or _amount("=" + job.get("MinMemoryCPU", "0")) * cpus
    out = set()
    for line in use.splitlines():
        f = dict(re.findall(r"(?:^|\s)(\w+)=(\S*)", line))
        total = _int(f.get("CPUEfctv", "") or f.get("CPUTot", "0"))
        if "NodeName" in f and total - _int(f.get("CPUAlloc", "0")) >= cpus and (
                not mem or _int(f.get("RealMemory", "0")) - _int(f.get("AllocMem", "0")) >= mem):
            out.add(f["NodeName"])
    return out


def _state(n: NodeRow, room: set[str]) -> str:
    """idle, mixed (partly used, with room for the job), allocated (no room), drained, down, ..."""
    s = n.state.rstrip("*~#!%$@^-").lower()
    if s == "mixed" and n.node in room:
        return "mixed"
    return ("idle" if s == "idle" else "allocated" if s in ("allocated", "mixed", "completing")
            else "drained" if s.startswith("drain") else "down" if s.startswith("down") else s)


def _free(nodes: Sequence[NodeRow], job: Mapping[str, str], use: str) -> int:
    """The nodes that could take one node of the job now: idle, or mixed with room for it."""
    room = _room(use, job)
    return sum(1 for n in _fit(nodes, job) if _state(n, room) in ("idle", "mixed"))


def _tally(nodes: Sequence[NodeRow], job: Mapping[str, str], queue: Sequence[QueueRow], use: str = "") -> list[str]:
    """The nodes that could fit the request, by state, and what the busy ones are doing."""
    fit = _fit(nodes, job)
    room = _room(use, job)
    by: dict[str, list[str]] = {}
    for n in fit:
        by.setdefault(_state(n, room), []).append(n.node)
    part = nodes[0].partition if nodes else job.get("Partition", "?")
    shown = ("idle", "mixed", "allocated", "drained", "down")
    counts = ", ".join(f"{len(by.get(k, []))} {'partly used with room for it' if k == 'mixed' else k}"
                       for k in shown if k != "mixed" or by.get(k))
    extra = "".join(f", {len(v)} {k}" for k, v in by.items() if k not in shown)
    asked = job.get("NumNodes", "?")
    lo, _, hi = asked.partition("-")
    asked = lo if hi in ("", lo) else asked
    cpus = job.get("NumCPUs", "?")
    out = [f"nodes in {part} that fit it: {counts}{extra} (of {len(fit)}); it asks {asked} "
           f"node{'' if asked == '1' else 's'}, {cpus} CPU{'' if cpus == '1' else 's'}"]
    running = [q for q in queue if q.state in ("RUNNING", "COMPLETING")]
    for q in running[:6]:
        on = [h for h in expand(q.nodelist) if h in by.get("allocated", []) + by.get("mixed", [])] if q.nodelist else []
        if on:
            end = f", until {q.end}" if q.end not in _UNSET else ""
            out.append(f"  {compress(on)}: job {q.job_id} ({q.name}, {q.user}, {counted(q.nodes, 'node')}{end})")
    for n in fit:
        if n.node in by.get("drained", []) + by.get("down", []):
            out.append(f"  {n.node}: {n.state}" + (f" ({n.reason})" if n.reason else ""))
    return out


def classify(job: Mapping[str, str], answers: Mapping[str, str]) -> Pending:
    """The pending explanation from the job's fields and :func:`queries`' answers (pure)."""
    reason = job.get("Reason", "")
    part = job.get("Partition", "")
    jid = job.get("JobId", "JOB")
    nodes = parse_nodes(answers.get("nodes", ""))
    queue = parse_queue(answers.get("queue", ""))
    asked = _int(job.get("NumNodes", "1"))
    evidence = [f"Slurm's reason: {reason}"]
    start = job.get("StartTime", "")
    estimate = ""
    if start not in _UNSET and reason not in ("BeginTime",):
        estimate = start + (f" on {job['SchedNodeList']}" if job.get("SchedNodeList", "") not in _UNSET else "")
    never = _never(job, nodes, asked)
    if reason in _NEVER or never:
        summary = "it can never run as it stands: " + (never[0] if never else _NEVER[reason].format(part=part))
        action = None
        if any("has feature" in w for w in never):
            action = f"drop or change --constraint (scontrol update JobId={jid} Features=...), or cancel it"
        elif any(w.startswith("partition") for w in never) or reason in ("PartitionDown", "PartitionInactive"):
            action = "ask an administrator to set it up, or submit to another partition (sinfo lists them)"
        elif any(w.startswith("it asks") for w in never):
            action = f"ask for at most {len({n.node for n in nodes})} nodes, or another partition; cancel this one"
        return Pending("never", summary, action, (*evidence, *never[1:], *_tally(nodes, job, queue, answers.get("use", ""))))
    if reason in _HELD:
        who = "an administrator" if reason == "JobHeldAdmin" else "its user (sbatch --hold or scontrol hold)"
        action = f"scontrol release {jid}" if reason != "JobHeldAdmin" else None
        return Pending("held", f"held by {who}", action, tuple(evidence))
    if reason == "Dependency":
        states = {q.job_id: q for q in parse_queue(answers.get("deps", ""))}
        lines, waits = [], []
        for kind, dep, mark in dependencies(job.get("Dependency", "")):
            q = states.get(dep)
            st = q.state if q else "not in the queue any more"
            lines.append(f"dependency {kind}:{dep}: job {dep}" + (f" ({q.name})" if q else "") + f" is {st}"
                         + (f", Slurm marks it {mark}" if mark else ""))
            if q and q.state in ("RUNNING", "PENDING"):
                waits.append(f"job {dep} " + _AFTER.get(kind, f"satisfies {kind}"))
        action = ("nothing to change: it starts when " + " and ".join(waits)) if waits else None
        return Pending("dependency", f"waiting for {len(lines)} dependenc{'y' if len(lines) == 1 else 'ies'}",
                       action, (*evidence, *lines))
    if reason == "BeginTime" and job.get("Restarts", "0") not in ("", "0"):  # Slurm's own hold after a requeue
        return Pending("begin_time", f"requeued (restart {job['Restarts']}): Slurm holds a requeued job before it may "
                       f"run again, until {start}", "nothing to change: it starts again by itself",
                       (*evidence, "a requeued job waits out its old credentials (AuthInfo cred_expire, 120 s by default)"))
    if reason == "BeginTime":
        return Pending("begin_time", f"it may not start before {start}",
                       f"to start it sooner: scontrol update JobId={jid} StartTime=now",
                       (*evidence, f"begin time (sbatch --begin): {start}"))
    if reason.startswith("Reservation") or (job.get("Reservation", "") not in _UNSET and reason != "Priority"):
        resv = job.get("Reservation", "")
        r = dict(re.findall(r"(\w+)=(\S*)", answers.get("reservation", "")))
        action = None
        lines = [f"reservation {resv}: " + " ".join(f"{k}={r[k]}" for k in ("StartTime", "EndTime", "Nodes", "State",
                                                                            "Flags") if k in r)] if r else []
        if r.get("State") == "INACTIVE" and r.get("StartTime"):
            action = f"nothing to change: it can start when reservation {resv} begins at {r['StartTime']}"
        return Pending("reservation", f"waiting for reservation {resv or '?'}", action, (*evidence, *lines))
    m = _LIMIT.match(reason)
    if m:
        return _limit(job, answers, m, evidence)
    tally = _tally(nodes, job, queue, answers.get("use", ""))
    me = _int(job.get("Priority", "0"))
    ahead = sorted((q for q in queue if q.state == "PENDING" and q.job_id != jid and q.priority > me),
                   key=lambda q: -q.priority)
    ahead_line = f"jobs ahead of it in {part}: {len(ahead)}" + (
        " (" + ", ".join(f"{q.job_id} {q.name} {counted(q.nodes, 'node')}" for q in ahead[:5]) + ")" if ahead else "")
    if estimate:
        evidence.append(f"Slurm's estimated start: {estimate}")
    if reason in ("Resources", "Nodes_required_for_job_are_DOWN,_DRAINED_or_reserved_for_jobs_in_higher_priority_partitions") \
            or reason.startswith("ReqNodeNotAvail"):
        free = _free(nodes, job, answers.get("use", ""))
        action = None
        if estimate:
            action = f"nothing to change: Slurm expects it to start at {estimate}"
        elif 0 < free < asked:
            action = f"--nodes {free} would fit the free nodes now"
        return Pending("resources", f"waiting for nodes: it asks {asked}, and not enough that fit it are free",
                       action, (*evidence, *tally, ahead_line))
    if reason == "Priority":
        action = f"nothing to change: Slurm expects it to start at {estimate}" if estimate else None
        return Pending("priority", f"{counted(len(ahead), 'job')} of higher priority go first in {part}", action,
                       (*evidence, ahead_line, *tally))
    if reason in ("None", ""):
        return Pending("other", "Slurm has not looked at it yet (reason None): ask again in a few seconds", None,
                       (*evidence, *tally))
    return Pending("other", f"Slurm's reason is {reason}", None, (*evidence, *tally, ahead_line))


def _limit(job: Mapping[str, str], answers: Mapping[str, str], m: re.Match[str], evidence: list[str]) -> Pending:
    """A QOS or association limit, by name and value, and what the user's running jobs already use."""
    kind, scope, what, per = m.group(1), m.group(2), m.group(3), m.group(4) or ""
    qos = kind == "QOS"
    fields = _limit_fields(answers.get("limit", ""), QOS_FORMAT if qos else ASSOC_FORMAT)
    owner = f"QOS {job.get('QOS', '?')}" if qos else f"association {job.get('Account', '?')}/{job.get('UserId', '?').split('(')[0]}"
    if what in ("Jobs", "SubmitJob"):
        field = {"QOS": {"MaxPerUser": "MaxJobsPerUser", "GrpPerUser": "GrpJobs", "Max": "MaxJobsPerUser",
                         "Grp": "GrpJobs"},
                 "Assoc": {"Max": "MaxJobs", "Grp": "GrpJobs"}}[kind].get(scope + per, "")
        if what == "SubmitJob":
            field = "MaxSubmitJobsPerUser" if qos else "MaxSubmitJobs"
        value = fields.get(field, "")
        named = f"{field}={value}" if value else ""
    else:
        key = _TRES.get(what, what.lower())
        field = (("MaxTRESPerUser" if per == "PerUser" else "MaxTRESPerJob" if per == "PerJob" else "MaxTRES")
                 if scope == "Max" else "GrpTRES") if qos else ("MaxTRES" if scope == "Max" else "GrpTRES")
        if what == "WallDuration":
            field, key = "MaxWall", ""
        value = fields.get(field, "")
        item = _tres(value, key) if key else value
        named = f"{field} {item}" if item else ""
    summary = f"held back by {owner}'s limit " + (named or f"({m.group(0)})")
    evidence = [*evidence, f"{owner}: " + (", ".join(f"{k}={v}" for k, v in fields.items() if k not in
                                                      ("Name", "Account", "User")) or "its limits could not be read")]
    mine = [q for q in parse_queue(answers.get("mine", "")) if not qos or q.qos == job.get("QOS")]
    if answers.get("mine") is not None:
        evidence.append(f"your running jobs{' in ' + owner if qos else ''}: {len(mine)}" + (
            " (" + ", ".join(f"{q.job_id} {q.name}: {counted(q.nodes, 'node')}, {counted(q.cpus, 'CPU')}" for q in mine[:5]) + ")"
            if mine else ""))
    wants = _tres(job.get("TRES", ""), _TRES.get(what, what.lower())) if what not in ("Jobs", "SubmitJob") else ""
    limit_item = named.split(" ", 1)[-1] if named else ""
    if wants and limit_item and _amount(wants) > _amount(limit_item) and per in ("PerUser", "PerAccount", ""):
        return Pending("never", f"it can never run in {owner}: it alone asks {wants}, over {named}",
                       f"ask for at most {limit_item}, or another QOS (--qos); cancel this one",
                       (*evidence, f"the job asks: {job.get('TRES', '')}"))
    if per == "PerJob" or what == "WallDuration":
        return Pending("never", f"it can never run in {owner}: it asks more than {named or m.group(0)}",
                       "ask for less, or another QOS (--qos)" if named else None, tuple(evidence))
    action = None
    if named and mine:
        action = "it starts when your running jobs there free enough: " + ", ".join(f"job {q.job_id}" for q in mine[:3])
    return Pending("limit", summary, action, tuple(evidence))


def _record(job_id: str, out_dir: str) -> int:
    """``python -m torchhpc.schedulers.slurm.pending JOB DIR``: save scontrol's record and each query's
    answer (the test data of tests/data/slurm/pending/ was recorded this way)."""
    import os

    from torchhpc.schedulers.slurm.parse import parse_scontrol

    runner = Runner()
    os.makedirs(out_dir, exist_ok=True)
    text = runner.run(["scontrol", "show", "job", "-o", job_id]).stdout
    with open(os.path.join(out_dir, "scontrol.txt"), "w") as f:
        f.write(text)
    for name, argv in queries(parse_scontrol(text)).items():
        with open(os.path.join(out_dir, f"{name}.txt"), "w") as f:
            f.write(runner.run(argv, check=False).stdout)
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(_record(sys.argv[1], sys.argv[2]))
