"""Why a Slurm job is pending, from what Slurm says: squeue, sinfo, sacctmgr, and the job's scontrol record.

:func:`queries` names the calls one ``status`` makes, all at once (one round, run concurrently
by :func:`explain`): the partition's nodes (``sinfo``) and what each has left (``scontrol show
node``: a partly used node with room for the job fits it), its queue (``squeue``), and only where the
job's reason asks for them, the dependencies' states and the QOS or association limit
(``sacctmgr``). :func:`classify` is a pure function of their parsed output, unit-tested on
output recorded from the dev cluster (tests/data/slurm/pending/). What the partition's nodes and
queue say about the job (its rows, the nodes that fit it, the tally) is read in
:mod:`~torchhpc.schedulers.slurm.pending_nodes`.

Nothing is guessed: the category comes from Slurm's reason, except that a request the partition
can never satisfy (more nodes than it has, a feature no node has, the partition down) is called
``never`` whatever the reason says; an action is given only where the evidence supports it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

from torchhpc.core.proc import Runner
from torchhpc.core.units import counted
from torchhpc.schedulers.pending import Pending
from torchhpc.schedulers.slurm.pending_nodes import (
    SINFO_FORMAT,
    SQUEUE_FORMAT,
    UNSET,
    amount,
    free_nodes,
    int_of,
    never_evidence,
    node_tally,
    parse_nodes,
    parse_queue,
)

__all__ = ["classify", "explain", "queries"]

QOS_FORMAT = "Name,MaxTRESPerUser,MaxJobsPerUser,MaxSubmitJobsPerUser,MaxTRESPerJob,MaxWall,GrpTRES,GrpJobs"
ASSOC_FORMAT = "Account,User,Partition,MaxJobs,MaxSubmitJobs,MaxTRES,MaxWall,GrpTRES,GrpJobs"
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
    if job.get("Reservation", "") not in UNSET:
        out["reservation"] = ["scontrol", "show", "reservation", "-o", job["Reservation"]]
    m = _LIMIT.match(job.get("Reason", ""))
    user = job.get("UserId", "").split("(")[0]
    if m and m.group(1) == "QOS" and job.get("QOS"):
        out["limit"] = ["sacctmgr", "-n", "-P", "show", "qos", job["QOS"], f"format={QOS_FORMAT}"]
    elif m:
        out["limit"] = ["sacctmgr", "-n", "-P", "show", "assoc", "where", f"user={user}",
                        f"account={job.get('Account', '')}", f"format={ASSOC_FORMAT}"]
    if m:
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
    vals = next((row for line in text.splitlines() if len(row := line.split("|")) == len(names)), [])
    return {k: v for k, v in zip(names, vals) if v}


def _tres(value: str, key: str) -> str:
    """``cpu=4,node=1`` -> the ``node`` item (``gres`` matches ``gres/gpu=...``)."""
    return next((item for item in value.split(",") if item.split("=")[0] == key or item.startswith(key + "/")), "")


def classify(job: Mapping[str, str], answers: Mapping[str, str]) -> Pending:
    """The pending explanation from the job's fields and :func:`queries`' answers (pure)."""
    reason = job.get("Reason", "")
    part = job.get("Partition", "")
    jid = job.get("JobId", "JOB")
    nodes = parse_nodes(answers.get("nodes", ""))
    queue = parse_queue(answers.get("queue", ""))
    asked = int_of(job.get("NumNodes", "1"))
    evidence = [f"Slurm's reason: {reason}"]
    start = job.get("StartTime", "")
    estimate = ""
    if start not in UNSET and reason not in ("BeginTime",):
        estimate = start + (f" on {job['SchedNodeList']}" if job.get("SchedNodeList", "") not in UNSET else "")
    never = never_evidence(job, nodes, asked)
    if reason in _NEVER or never:
        summary = "it can never run as it stands: " + (never[0] if never else _NEVER[reason].format(part=part))
        action = None
        if any("has feature" in w for w in never):
            action = f"drop or change --constraint (scontrol update JobId={jid} Features=...), or cancel it"
        elif any(w.startswith("partition") for w in never) or reason in ("PartitionDown", "PartitionInactive"):
            action = "ask an administrator to set it up, or submit to another partition (sinfo lists them)"
        elif any(w.startswith("it asks") for w in never):
            action = f"ask for at most {len({n.node for n in nodes})} nodes, or another partition; cancel this one"
        return Pending("never", summary, action, (*evidence, *never[1:], *node_tally(nodes, job, queue, answers.get("use", ""))))
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
    if reason.startswith("Reservation") or (job.get("Reservation", "") not in UNSET and reason != "Priority"):
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
    tally = node_tally(nodes, job, queue, answers.get("use", ""))
    me = int_of(job.get("Priority", "0"))
    ahead = sorted((q for q in queue if q.state == "PENDING" and q.job_id != jid and q.priority > me),
                   key=lambda q: -q.priority)
    ahead_line = f"jobs ahead of it in {part}: {len(ahead)}" + (
        " (" + ", ".join(f"{q.job_id} {q.name} {counted(q.nodes, 'node')}" for q in ahead[:5]) + ")" if ahead else "")
    if estimate:
        evidence.append(f"Slurm's estimated start: {estimate}")
    if reason in ("Resources", "Nodes_required_for_job_are_DOWN,_DRAINED_or_reserved_for_jobs_in_higher_priority_partitions") \
            or reason.startswith("ReqNodeNotAvail"):
        free = free_nodes(nodes, job, answers.get("use", ""))
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
    if wants and limit_item and amount(wants) > amount(limit_item) and per in ("PerUser", "PerAccount", ""):
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
