"""The in-allocation supervisor: a job that survives a node loss on its own (docs/resilience.md).

The batch script (Slurm, PBS) runs ``python -m torchhpc.supervisor`` on the batch host in place
of the bare launch. The supervisor starts the launch step on N healthy nodes of the allocation
(N+K nodes with ``--spares K``), watches the step's nodes and ranks itself, and on a failure it
classifies with the verdict's classes (:mod:`torchhpc.diagnose.verdict`):

* node failure, hang, rendezvous/NCCL/network error, a lost peer: probe the nodes, exclude the
  failed ones, start the step again on N healthy nodes (spares first), with
  ``TORCHHPC_RESTART_COUNT`` one higher, at most ``--max-restarts`` times;
* an exception in the program, out of memory, an import error, a native crash: never restart;
  the job ends with the verdict.

When no N healthy nodes are left it requeues the job with the failed nodes excluded
(``--requeue``), or ends with the verdict. Each attempt is a line of ``<job dir>/attempts.json``.

Nothing waits for Slurm's SlurmdTimeout or for gloo's and NCCL's 30-minute timeouts: every
``--probe-every`` seconds the supervisor opens one TCP connection to each step node's slurmd
(a node that loses power, or its link, answers no more), and the hang watch reads the ranks'
log files' last writes, then their stacks (:mod:`torchhpc.diagnose.probe`, the node probe).

Stdlib only; runs with the submitting interpreter on the batch host.
"""

from __future__ import annotations

from torchhpc.supervisor.attempts import Attempt, load_attempts
from torchhpc.supervisor.policy import POLICY, RESTART_CLASSES, action_for

__all__ = ["POLICY", "RESTART_CLASSES", "Attempt", "action_for", "load_attempts"]
