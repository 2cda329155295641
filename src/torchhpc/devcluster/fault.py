"""Fault injection: a node that fails as a power loss would, and comes back.

``fail`` cuts the node's link (both ends of its veth pair) and then ends, with SIGKILL,
every process living in the node's network namespace: its slurmd, its slurmstepd and
every rank a job runs there; its memory goes with it (its own /dev/shm emptied).
Nothing says goodbye: peers on other nodes see no FIN (the link is down before the
processes die), Slurm sees a node that stops answering, exactly what a node that loses
power looks like from the outside. ``revive`` brings the link back and starts the
node's slurmd again; Slurm returns the node to service when it registers
(``ReturnToService=2``).

Both are idempotent and return what they did, in words. The failed nodes are
recorded in the state file, so the cluster counts as healthy (a failed node's slurmd
is meant to be dead) and ``down`` still cleans everything up.
"""

from __future__ import annotations

import os
import shutil
import signal

from torchhpc.core.proc import Runner, default_runner
from torchhpc.devcluster import daemons, netns
from torchhpc.devcluster.degrade import link_of
from torchhpc.devcluster.state import ClusterState
from torchhpc.errors import CommandError, DevClusterError

__all__ = ["fail", "revive"]


def _link(state: ClusterState, node: str, up: bool, runner: Runner) -> list[str]:
    """Set both ends of ``node``'s link up or down; the ends whose state changed."""
    changed = []
    for ns, dev in link_of(state, node):
        shown = runner.run(["ip", "-n", ns, "-o", "link", "show", "dev", dev], check=False, timeout=10).stdout
        is_up = ",UP" in shown or "<UP" in shown
        if is_up == up:
            continue
        try:
            runner.run(["ip", "-n", ns, "link", "set", "dev", dev, "up" if up else "down"], timeout=10)
        except CommandError as e:
            raise DevClusterError(f"could not set {dev} in {ns} {'up' if up else 'down'}: {e.message}",
                                  "is the dev cluster up (`torchhpc devcluster status`) and are you root?") from None
        changed.append(dev)
    return changed


def fail(state: ClusterState, node: str, runner: Runner | None = None) -> list[str]:
    """Cut ``node``'s link, then SIGKILL every process in its namespace (slurmd, slurmstepd, ranks)."""
    runner = runner or default_runner()
    done = []
    if _link(state, node, False, runner):
        done.append("link cut")
    if node not in state.failed:  # recorded before the kill: a slurmd dead while unrecorded died of itself
        state.failed.append(node)
        state.save()
    pids = netns.pids_in([state.netns(node)])
    if pids:
        # SIGKILL only, as a power loss: a SIGTERM first let the batch shell's trap write "CANCELLED" (issue 70)
        daemons.kill_pids(pids, timeout=5.0, signals=(signal.SIGKILL,))
        done.append(f"{len(pids)} processes killed (slurmd and slurmstepd among them)" if any(
            d.pid in pids for d in state.daemons) else f"{len(pids)} processes killed")
    shm = state.shm_dir(node)
    held = os.listdir(shm) if os.path.isdir(shm) else []
    for name in held:  # a power loss: what the node held in memory is gone
        path = os.path.join(shm, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    if held:
        done.append("its memory emptied")
    return done


def revive(state: ClusterState, node: str, runner: Runner | None = None) -> list[str]:
    """Bring ``node``'s link back and start its slurmd again (if it is not running)."""
    from torchhpc.devcluster.bringup import restart_slurmd

    runner = runner or default_runner()
    done = []
    if _link(state, node, True, runner):
        done.append("link up")
    name = f"slurmd-{node}"
    if not any(d.name == name and daemons.alive(d) for d in state.daemons):
        restart_slurmd(state, node)
        done.append("slurmd started")
    if node in state.failed:
        state.failed.remove(node)
        state.save()
    return done
