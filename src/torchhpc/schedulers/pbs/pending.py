"""Why a PBS job is queued, from the attributes ``qstat -f`` already gave ``status``: no other call.

PBS's scheduler writes its reason into the job's ``comment`` (``Not Running: ...`` for now,
``Can Never Run: ...`` for good), with the numbers where it has them (``Insufficient amount of
resource: ncpus (R: 88 A: 50 T: 50)``: requested, available, total). Holds are in
``Hold_Types``, dependencies in ``depend``, a begin time in ``Execution_Time``, and PBS Pro's
estimate in ``estimated.start_time``. Same rule as Slurm's: nothing guessed, no evidence no action.

Tested on tests/data/pbs/qstat_full_pending.txt: no PBS server runs where torchhpc is developed,
so that file is assembled by hand in ``qstat -f``'s format, its comments being PBS's own strings
(OpenPBS's scheduler message table, as sites show them); see tests/data/pbs/README.md.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from torchhpc.schedulers.pending import Pending

__all__ = ["classify"]

_RESOURCE = re.compile(r"Insufficient amount of (?:queue |server )?resource: (\S+)(?: \(R: (\S+) A: (\S+) T: (\S+)\))?")
_RESOURCES = ("Not enough free nodes available", "Not enough of the right type of nodes are available",
              "Node is in an ineligible state", "is requesting an exclusive node and node is in use",
              "No available resources on nodes", "Not enough total nodes available", "Insufficient amount of")
_LIMIT = re.compile(r"limit|would exceed", re.I)


def _num(text: str) -> float | None:
    m = re.match(r"(\d+(?:\.\d+)?)", text or "")
    return float(m.group(1)) if m else None


def classify(job_id: str, attrs: Mapping[str, str]) -> Pending:
    """The pending explanation of one queued, held or waiting PBS job (pure)."""
    comment = (attrs.get("comment") or "").strip()
    holds = (attrs.get("Hold_Types") or "n").strip()
    evidence = [f"PBS's comment: {comment}" if comment else "PBS left no comment yet"]
    expected: str | None = None  # the action while it waits for resources
    if attrs.get("estimated.start_time"):
        evidence.append(f"PBS's estimated start: {attrs['estimated.start_time']}"
                        + (f" on {attrs['estimated.exec_vnode']}" if attrs.get("estimated.exec_vnode") else ""))
        expected = f"nothing to change: PBS expects it to start at {attrs['estimated.start_time']}"
    short = job_id.split(".")[0]
    if comment.startswith("Can Never Run"):
        why = comment.split(":", 1)[1].strip() if ":" in comment else comment
        m = _RESOURCE.search(why)
        if m and m.group(2):
            evidence.append(f"{m.group(1)}: it asks {m.group(2)}, {m.group(3)} available, {m.group(4)} in all")
            why = f"it asks {m.group(2)} {m.group(1)}; there are {m.group(4)} in all"
        return Pending("never", f"it can never run as it stands: {why}", None, tuple(evidence))
    if attrs.get("depend") and "s" in holds:
        deps = attrs["depend"]
        return Pending("dependency", f"waiting for its dependencies ({deps})", None,
                       (*evidence, f"depend = {deps}", "Hold_Types = s: PBS releases it when they are satisfied"))
    if holds != "n" and holds:
        by = {"u": "its user (qsub -h or qhold)", "o": "an operator", "s": "the system", "p": "a bad password"}
        who = " and ".join(by.get(h, h) for h in holds)
        return Pending("held", f"held by {who}", f"qrls {short}" if holds == "u" else None,
                       (*evidence, f"Hold_Types = {holds}"))
    if (attrs.get("job_state") or "")[:1] == "W" and attrs.get("Execution_Time"):
        return Pending("begin_time", f"it may not start before {attrs['Execution_Time']}", None,
                       (*evidence, f"Execution_Time = {attrs['Execution_Time']} (qsub -a)"))
    why = comment.split(":", 1)[1].strip() if comment.startswith("Not Running:") else comment
    m = _RESOURCE.search(why)
    if m and m.group(2):
        asked, total = _num(m.group(2)), _num(m.group(4))
        evidence.append(f"{m.group(1)}: it asks {m.group(2)}, {m.group(3)} available, {m.group(4)} in all")
        if asked is not None and total is not None and asked > total:
            return Pending("never", f"it asks {m.group(2)} {m.group(1)}; there are {m.group(4)} in all", None,
                           tuple(evidence))
        return Pending("resources", f"waiting for {m.group(1)}: {m.group(3)} of the {m.group(2)} it asks are free",
                       expected, tuple(evidence))
    if any(s in why for s in _RESOURCES):
        return Pending("resources", f"waiting for resources: {why}", expected, tuple(evidence))
    if "interfere with a confirmed reservation" in why:
        return Pending("reservation", f"a reservation holds the resources: {why}", None, tuple(evidence))
    if "interfere with a top job" in why or "strict sorted order" in why:
        return Pending("priority", f"jobs ahead of it go first: {why}", None, tuple(evidence))
    if "Queue not started" in why:
        return Pending("never", f"its queue {attrs.get('queue', '?')} is not started: no job in it starts", None,
                       tuple(evidence))
    if _LIMIT.search(why):
        return Pending("limit", f"held back by a limit: {why}", None, tuple(evidence))
    return Pending("other", f"PBS says: {why}" if why else "PBS has not said why yet", None, tuple(evidence))
