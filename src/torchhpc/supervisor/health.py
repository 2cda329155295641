"""The health gate before each attempt: the next attempt's candidate nodes, checked in one step.

A node that answers the liveness probe may still fail the attempt at once: its view of the job
directory is gone (a lost mount), the rendezvous port is held by a leftover process, its GPUs no
longer answer. Each such failure costs a whole attempt (start, rendezvous, a timeout) and, with
the no-progress stop, a restart. The gate runs this module once on every candidate node, through
the allocation (:meth:`~torchhpc.schedulers.allocation.Allocation.on_nodes`: one ``srun --overlap``
step over the nodes under Slurm), within :data:`GATE_S` seconds; a failing node is excluded like a
dead one, and ``attempts.json`` says why (``health``: ``{node: reason}``). Where no node answers
at all, the gate itself failed (the step did not start): it excludes no one and says so.

The node side (``python -m torchhpc.supervisor.health --job-dir D --port P [--gpus]``) is stdlib
only and checks what ``doctor`` and ``bench nodes`` check, the quick part of it:

* the job directory is writable from the node (a file created and removed);
* the rendezvous port is free (a bind; ``doctor``'s port check);
* where GPUs are asked for, ``nvidia-smi -L`` answers within 3 s.

(The node daemon answering is the supervisor's liveness probe, run before the gate.)
It prints one JSON line: ``{"node": NAME, "fail": REASON or ""}``.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Optional

__all__ = ["GATE_S", "check_here", "gate"]

GATE_S = 5.0  # the whole gate, every node at once


def _node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def check_here(job_dir: str, port: int, gpus: bool) -> str:
    """'' when this node may run the next attempt, else why not (the first failing check)."""
    probe = os.path.join(job_dir, f".health-{_node_name()}-{os.getpid()}")
    try:
        with open(probe, "w") as f:
            f.write("ok\n")
        os.unlink(probe)
    except OSError as e:
        return f"job directory {job_dir} not writable from the node: {e.strerror or e}"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", port))
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            return f"rendezvous port {port} in use on the node (a leftover process holds it)"
        return f"rendezvous port {port} cannot be bound: {e.strerror or e}"
    if gpus:
        try:
            done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=3)
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"nvidia-smi does not answer: {e}"
        if done.returncode != 0 or "GPU" not in done.stdout:
            return f"nvidia-smi -L failed (exit {done.returncode}): {(done.stderr or done.stdout).strip()[:200]}"
    return ""


def gate(on_nodes: Callable[[Sequence[str], Sequence[str]], list[str]], nodes: Sequence[str], job_dir: str,
         port: int, gpus: bool, python: str = sys.executable, env: Optional[dict[str, str]] = None,
         timeout: float = GATE_S) -> dict[str, str]:
    """``{node: reason}`` for the ``nodes`` that fail the checks (or do not answer within ``timeout``)."""
    if not nodes:
        return {}
    argv = [python, "-m", "torchhpc.supervisor.health", "--job-dir", job_dir, "--port", str(port)]
    argv += ["--gpus"] if gpus else []
    proc = subprocess.Popen(on_nodes(argv, nodes), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    answers: dict[str, str] = {}
    for line in (out or "").splitlines():
        try:
            d = json.loads(line)
            answers[str(d["node"])] = str(d.get("fail", ""))
        except (ValueError, KeyError, TypeError):
            continue
    if not answers:  # the gate itself failed (the step did not start): that says nothing of the nodes
        raise RuntimeError(f"no node answered within {timeout:g}s (exit {proc.returncode}): "
                           f"{(err or '').strip()[-300:] or 'no output'}")
    if len(nodes) == 1 and len(answers) == 1 and nodes[0] not in answers:  # a name the node knows itself by
        answers = {nodes[0]: next(iter(answers.values()))}
    bad = {}
    for n in nodes:
        reason = answers.get(n, answers.get(n.split(".")[0]))
        if reason is None:
            bad[n] = f"no answer from the health check within {timeout:g}s"
        elif reason:
            bad[n] = reason
    return bad


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m torchhpc.supervisor.health",
                                description="One node's part of the supervisor's health gate: prints one JSON line.")
    p.add_argument("--job-dir", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--gpus", action="store_true")
    a = p.parse_args(argv)
    t = time.monotonic()
    fail = check_here(a.job_dir, a.port, a.gpus)
    print(json.dumps({"node": _node_name(), "fail": fail, "s": round(time.monotonic() - t, 3)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
