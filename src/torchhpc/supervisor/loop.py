"""The supervisor's loop: start the step, watch it, classify its end, restart or end.

One attempt at a time. The step is the batch script's own launch, exported to this process as
the bash function ``_torchhpc_step``; each attempt runs it with

* ``TORCHHPC_STEP_NODES`` (``node1,node3``) and ``TORCHHPC_STEP_HOSTS`` (``node1:2,node3:2``,
  mpirun's host list): where the launch runs (``srun --nodelist``, ``mpirun --host``);
* ``MASTER_ADDR``: the first step node's IPv4 (the rendezvous moves when the master node died),
  ``MASTER_PORT``: moved per attempt (a dead attempt's socket may linger);
* ``TORCHHPC_RESTART_COUNT``: the number of attempts before this one (a requeued job's too).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Optional

from torchhpc.core.exitcodes import exit_code_for
from torchhpc.core.launcher_kind import LauncherKind
from torchhpc.core.proc import Runner
from torchhpc.core.units import counted, plural
from torchhpc.jobdir.layout import RANKS_DIR
from torchhpc.schedulers import get_scheduler
from torchhpc.schedulers.allocation import ipv4
from torchhpc.supervisor.attempts import Attempt, load_attempts, save_attempts
from torchhpc.supervisor.attempts import storm as record_storm
from torchhpc.supervisor.liveness import HEARTBEAT_VAR, PROBE_TIMEOUT_S, Heartbeats, Liveness
from torchhpc.supervisor.memtier import free_memory, persist_after_loss
from torchhpc.supervisor.outcome import Outcome, classify_attempt, log_sizes, wrote
from torchhpc.supervisor.policy import action_for, choose, why_not
from torchhpc.supervisor.progress import NoProgress
from torchhpc.supervisor.resume import restart_args
from torchhpc.supervisor.standby import Standby

__all__ = ["Options", "Supervisor"]

POLL_S = 0.5  # the hang watch's check
BEAT_POLL_S = 0.1  # the step's end, the heartbeats' silence
STARTING = 4  # the hang timeout's multiple allowed before an attempt's first line (see Supervisor._attempt)


@dataclass
class Options:
    job_dir: str
    nodes: int
    nproc_per_node: int
    launcher: str
    max_restarts: int = 0
    hang_timeout: Optional[float] = None
    requeue: bool = False
    probe_every: float = 2.0
    misses: int = 2  # failed liveness checks in a row before a node counts as dead
    scheduler: str = "slurm"  # whose allocation this runs in (asked through schedulers/allocation.py)
    max_no_progress: int = 3  # attempts in a row without a checkpoint advance before no-progress (0: off)
    checkpoint_dir: Optional[str] = None  # where the program's checkpoints are (supervisor/progress.py)
    on_restart_append: str = ""  # arguments added on attempts after the first (supervisor/resume.py)
    health: bool = True  # the health gate before each attempt (supervisor/health.py)
    min_nodes: Optional[int] = None  # go on with this many nodes at least when no spare is left (--min-nodes)
    warm: bool = False  # restarts from a standby interpreter per node (supervisor/standby.py)


def say(text: str) -> None:
    print(f"torchhpc: supervisor: {text}", flush=True)


class Supervisor:
    def __init__(self, opts: Options, runner: Optional[Runner] = None,
                 env: Optional[dict[str, str]] = None, clock: Callable[[], float] = time.time) -> None:
        self.o = opts
        self.runner = runner or Runner()
        self.env = dict(os.environ if env is None else env)
        self.clock = clock
        self.alloc = get_scheduler(opts.scheduler, self.runner).allocation_of("", self.env)  # the job we run in
        self.job = self.alloc.job_id
        self.ranks_dir = os.path.join(opts.job_dir, RANKS_DIR)
        self._warmed: set[str] = set()
        self._watching = ""  # the node the watch on this one runs on (supervisor/sentinel.py)
        self._watch_misses, self._lost_watch = 0, set[str]()
        self.beats: Optional[Heartbeats] = None

    def _here(self, allocation: list[str]) -> str:
        """The node this supervisor runs on (the batch host): where the ranks' heartbeats go, what its watch watches."""
        return self.env.get("SLURMD_NODENAME") or (allocation[0] if allocation else "")

    def _listen(self, allocation: list[str]) -> None:
        """The heartbeat socket (supervisor/liveness.py), at the address the ranks reach this node by."""
        host = "127.0.0.1" if self.alloc.here else ipv4(self._here(allocation))
        try:
            self.beats = Heartbeats(host)
        except OSError as e:  # the probe alone still finds a lost node, a few seconds later
            say(f"no heartbeat socket ({e}): lost nodes are found by the probe alone")

    # -- the loop ---------------------------------------------------------------------------
    def run(self) -> int:
        allocation = self.alloc.nodes()
        history = load_attempts(self.o.job_dir)
        excluded = {h for a in history for h in a.get("excluded", ())}
        previous: list[str] = []
        progress = NoProgress(self.o.max_no_progress, self.o.job_dir, self.o.checkpoint_dir)
        say(f"job {self.job}: {len(allocation)} nodes ({','.join(allocation)}), {self.o.nodes} used, "
            f"max restarts {self.o.max_restarts}" + (f", excluded before: {','.join(sorted(excluded))}" if excluded else ""))
        self._watch_own_node(allocation)
        if allocation:
            self._listen(allocation)
        standby = Standby(self.alloc, self.job, sys.executable, self.env, say, agent=LauncherKind(self.o.launcher).per_node)
        if self.o.warm:
            standby.start(h for h in allocation if h not in excluded)
        while True:
            usable = [h for h in allocation if h not in excluded and self.alloc.alive(h)]
            dead_now = [h for h in allocation if h not in excluded and h not in usable]
            health_s, sick = self._health(usable, len(history))
            if sick:
                say("health gate: " + "; ".join(f"{h}: {why}" for h, why in sorted(sick.items())) + ": excluded")
                excluded |= set(sick)
                usable = [h for h in usable if h not in sick]
            step_nodes = choose(allocation, previous, usable, self.o.nodes)
            count = len(history)
            if len(step_nodes) < min(self.o.nodes, self.o.min_nodes or self.o.nodes):
                excluded |= set(dead_now)
                return self._out_of_nodes(history, sorted(excluded), usable)
            if len(step_nodes) < self.o.nodes:  # no spare left, but enough to go on: the job shrinks (--min-nodes)
                say(f"no spare left: going on with {counted(len(step_nodes), 'node')} of {self.o.nodes} "
                    f"(--min-nodes {self.o.min_nodes}): world size {len(step_nodes) * self.o.nproc_per_node} "
                    f"instead of {self.o.nodes * self.o.nproc_per_node}")
            attempt = Attempt(attempt=count, nodes=step_nodes, started=self.clock(), job_id=self.job,
                              health_s=health_s, health=sick, probe_s=self.o.probe_every,
                              world_size=len(step_nodes) * self.o.nproc_per_node)
            self._warm([h for h in usable if h not in step_nodes])
            say(f"attempt {count} on {','.join(step_nodes)} (TORCHHPC_RESTART_COUNT={count})")
            if self.beats:
                self.beats.reset()
            out = self._attempt(attempt, standby.env_for(count))
            attempt.ended, attempt.klass, attempt.exit_code = self.clock(), out.klass, out.rc
            attempt.rank, attempt.detail = out.rank, out.detail[:300]
            attempt.found_by = out.found_by if out.klass is not None else ""
            attempt.fault, attempt.teardown_s = out.fault, out.teardown_s
            attempt.first_line = out.first_line
            attempt.checkpoint_step = progress.after(out.klass)
            excluded |= set(out.dead)
            if self._watching in out.dead:  # the watch died with its node: watch from a survivor
                self._watch_own_node(allocation, excluded | {self._watching})
            if out.teardown:
                self._clear_stop()
            attempt.excluded = sorted(excluded)
            history.append(attempt.to_json())
            save_attempts(self.o.job_dir, history)
            if out.klass is None:
                say(f"attempt {count} succeeded")
                return 0
            who = f" (rank {out.rank})" if out.rank is not None else ""
            say(f"attempt {count} ended: {out.klass}{who}" + (f": {out.detail}" if out.detail else "")
                + (f"; excluded {','.join(out.dead)}" if out.dead else ""))
            if self._stopping():
                say("the stop file exists (time limit or preemption): no restart")
                return out.rc
            why = why_not(out.klass, count, self.o.max_restarts)
            if why and out.dead and self.o.requeue and action_for(out.klass) == "restart":
                return self._requeue(sorted(excluded))
            if why:
                say(why)
                return exit_code_for(out.klass)
            storm = progress.why_stop()
            if storm:
                say(storm)
                record_storm(self.o.job_dir, history, storm)
                return exit_code_for("no-progress")
            previous = [h for h in step_nodes if h not in excluded]
            if out.dead:  # the lost node's ranks have one copy left in memory: the survivors write it to disk
                persist_after_loss(self.alloc, self.env, self.job, previous, say)

    def _watch_own_node(self, allocation: list[str], excluded: Iterable[str] = ()) -> None:
        """The supervisor cannot survive its own node: a watch on another node of the allocation ends the job as
        node-failure, allocation released, if this one dies (supervisor/sentinel.py). Never waited for; started
        again elsewhere when its node is lost."""
        host = self._here(allocation)
        others = [h for h in allocation if h != host and h not in set(excluded)]
        self._watching = ""
        if not host or not others:
            return
        from torchhpc.supervisor.sentinel import sentinel_argv

        argv = sentinel_argv(sys.executable, self.o.job_dir, host, int(self.env.get("SLURM_RESTART_COUNT") or 0))
        try:
            self.alloc.start_watch(argv, others[-1], self.env)
            self._watching = others[-1]
            say(f"watching this node, {host}, from {others[-1]}: if it is lost the job ends (node-failure)")
        except Exception as e:  # the watch is a safety net: the job runs without it, as before
            say(f"could not start the watch on this node from {others[-1]}: {e}")

    def _check_watch(self, step_nodes: list[str]) -> None:
        """The watch's node, when it is not one of the step's (a spare): lost, the watch is started elsewhere."""
        node = self._watching
        if not node or node in step_nodes:
            return
        self._watch_misses = 0 if self.alloc.alive(node, timeout=PROBE_TIMEOUT_S) else self._watch_misses + 1
        if self._watch_misses >= self.o.misses:
            say(f"{node}, where the watch on this node ran, stopped answering: watching from another node")
            self._watch_misses, self._lost_watch = 0, self._lost_watch | {node}
            self._watch_own_node(self.alloc.nodes(), self._lost_watch)

    def _out_of_nodes(self, history: list[dict[str, object]], excluded: list[str], usable: list[str]) -> int:
        if self.o.requeue and history:
            return self._requeue(excluded)
        need = min(self.o.nodes, self.o.min_nodes or self.o.nodes)
        say(f"only {counted(len(usable), 'healthy node')} ({','.join(usable) or 'none'}) for {need}"
            + (f" (--min-nodes; {self.o.nodes} asked)" if need < self.o.nodes else "") + "; "
            f"excluded: {','.join(excluded) or 'none'}: the job ends (node-failure)")
        return exit_code_for("node-failure")

    def _requeue(self, excluded: list[str]) -> int:
        """No spare left: requeue the job with the failed nodes excluded (``--requeue``)."""
        say(f"no spare left: requeuing job {self.job} without {','.join(excluded)}")
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the requeue signals the batch step: finish the update
        why = self.alloc.requeue(excluded)
        if why:
            say(f"could not exclude the nodes: {why}")
        return 0

    def _stopping(self) -> bool:
        stop = self.env.get("TORCHHPC_STOP_FILE")
        return bool(stop) and os.path.exists(stop)  # type: ignore[arg-type]

    def _clear_stop(self) -> None:
        """Remove a stop file the step's own teardown made. Left in place, it reads as a time-limit
        warning or a preemption: the supervisor would give up its restart and the batch shell would
        requeue the job without the failed node excluded (seen in CI), and a restarted attempt's
        ranks would stop at their first step."""
        stop = self.env.get("TORCHHPC_STOP_FILE")
        if stop and os.path.exists(stop):
            say("the stop file came from the stopped step's teardown (SIGTERM to its ranks): removed")
            for path in (stop, stop + ".taken"):  # and a rank's word that it took it (dist/stop.py)
                with contextlib.suppress(OSError):
                    os.unlink(path)

    def _health(self, nodes: list[str], count: int) -> tuple[Optional[float], dict[str, str]]:
        """The health gate over the candidate nodes (supervisor/health.py): its seconds and the failing nodes."""
        if not self.o.health or not nodes:
            return None, {}
        from torchhpc.supervisor.health import gate

        gpus = any(self.env.get(v) for v in ("SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS", "SLURM_GPUS_PER_NODE"))
        t = self.clock()
        try:
            sick = gate(self.alloc.on_nodes, nodes, self.o.job_dir, self._port(count), gpus)
        except Exception as e:  # the gate is a courtesy: a gate that cannot run excludes no one
            say(f"health gate not run: {type(e).__name__}: {e}")
            return None, {}
        return round(self.clock() - t, 3), sick

    def _warm(self, spares: list[str]) -> None:
        """Page Python and torch in on the idle spares, once, in the background: a spare's first attempt
        then reads them from memory, not from a cold (often network) file system. Never waited for."""
        todo = [h for h in spares if h not in self._warmed]
        if not todo or not self.o.health:
            return
        self._warmed.update(todo)
        try:
            subprocess.Popen(self.alloc.on_nodes([sys.executable, "-c", "import torch"], todo),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        except Exception as e:  # a courtesy: the attempt does not depend on it
            say(f"could not warm the spares: {e}")

    def _port(self, count: int) -> int:
        """The rendezvous port of attempt ``count``: moved per attempt (a dead attempt's socket may linger)."""
        base = int(self.env.get("TORCHHPC_BASE_PORT") or self.env.get("MASTER_PORT") or 29500)
        return 10000 + (base - 10000 + 101 * count) % 20000

    # -- one attempt -------------------------------------------------------------------------
    def _env(self, attempt: Attempt) -> dict[str, str]:
        env = dict(self.env)
        base = int(env.get("TORCHHPC_BASE_PORT") or env.get("MASTER_PORT") or 29500)
        env.update(
            TORCHHPC_STEP_NODES=",".join(attempt.nodes),
            # the step's size (fewer nodes than asked after a shrink): srun --nodes/--ntasks, torchrun --nnodes, mpirun -np
            TORCHHPC_STEP_NNODES=str(len(attempt.nodes)),
            TORCHHPC_STEP_NTASKS=str(len(attempt.nodes) * self.o.nproc_per_node),
            TORCHHPC_STEP_HOSTS=",".join(f"{h}:{self.o.nproc_per_node}" for h in attempt.nodes),
            TORCHHPC_RESTART_COUNT=str(attempt.attempt),
            TORCHHPC_BASE_PORT=str(base),
            MASTER_ADDR=ipv4(attempt.nodes[0]),
            MASTER_PORT=str(self._port(attempt.attempt)),
            **({HEARTBEAT_VAR: self.beats.address} if self.beats else {}),  # the ranks' boot sends here
            # srun's --overlap (also the srun mpirun starts its daemons with): a failed attempt's step
            # holds its CPUs until the dead node's part of it is cleaned up, after SlurmdTimeout.
            SLURM_OVERLAP="1",
        )
        return env

    def _attempt(self, attempt: Attempt, warm: dict[str, str]) -> Outcome:
        sizes = log_sizes(self.ranks_dir)
        attempt.launched = self.clock()
        extra = restart_args(self.o.on_restart_append, attempt.attempt, say=say)
        if extra:
            say(f"attempt {attempt.attempt} adds to the program: {' '.join(extra)}")
        watch = self._hang_watch(attempt)
        if watch is not None:  # the marks of the ranks' return (boot/sitecustomize.py) are per attempt: cleared
            from torchhpc.diagnose import exits  # before the step starts (after, at load, a quick rank's was lost)

            exits.clear(self.o.job_dir)
        # "$@": the rendered step ends its launch line with it when --on-restart-append is given
        proc = self.alloc.start_step(["bash", "-c", '_torchhpc_step "$@"', "_torchhpc_step", *extra],
                                     {**self._env(attempt), **warm})
        first_line: Optional[float] = None
        live = Liveness(self.alloc, attempt.nodes, self.o.probe_every, self.o.misses, PROBE_TIMEOUT_S, self.beats,
                        self.clock())
        next_watch = 0.0
        while True:
            rc = proc.poll()
            if rc is None:
                live.wait(BEAT_POLL_S, self.clock)  # heartbeats noted as they come
                rc = proc.poll()
            if rc is not None:
                seen = self.clock()
                out = self._judge(rc, attempt, sizes)
                out.fault, out.teardown_s = (seen, 0.0) if out.klass else (None, None)
                out.first_line = first_line
                return out
            now = self.clock()
            if first_line is None and wrote(self.ranks_dir, sizes):
                first_line = now  # within POLL_S of the rank's first line
            dead, found_by = live.dead(now)  # the heartbeats' silence confirmed by a probe, or the probe's own rule
            if live.probed:
                self._check_watch(attempt.nodes)
            if dead:
                say(f"{plural(len(dead), 'node')} {','.join(dead)} stopped answering: stopping the step")
                fault = self.clock()
                rc = self.alloc.kill_step(proc, grace=0.0)  # a dead node's step never ends cleanly: no grace
                return Outcome("node-failure", rc, dead, detail=f"{','.join(dead)} unreachable", teardown=True,
                               fault=fault, found_by=found_by, teardown_s=round(self.clock() - fault, 3),
                               first_line=first_line)
            if watch is None or now < next_watch:
                continue
            next_watch = now + POLL_S
            # Until a rank of this attempt has written a byte (imports, rendezvous, a checkpoint load; a
            # starved rank may use little CPU on a busy node) the quiet allowed is STARTING times the
            # timeout (ft_launcher likewise waits longer for the first heartbeat).
            starting = first_line is None
            verdict = watch.check("RUNNING", now, attempt.started, watch.timeout * STARTING if starting else None)
            if verdict and verdict.at_exit:  # every rank's program had ended: what hung at exit is stopped, a success
                self.alloc.kill_step(proc)
                return Outcome(None, 0, detail="; ".join(verdict.at_exit), found_by="hang-watch", first_line=first_line)
            if verdict:
                rank = verdict.culprits[0] if verdict.culprits else None
                out = Outcome("hang", 1, rank=rank, detail=f"quiet for {watch.quiet:.0f}s", teardown=not self._stopping(),
                              fault=now, found_by="hang-watch", first_line=first_line)
                out.rc = self.alloc.kill_step(proc)
                out.teardown_s = round(self.clock() - now, 3)
                return out

    def _hang_watch(self, attempt: Attempt) -> Any:
        """The hang watch of one attempt, through the allocation (diagnose/hang.py's, as ``wait`` uses)."""
        from torchhpc.diagnose import hang

        if not self.o.hang_timeout:
            return None
        match = self.alloc.rank_match()
        return hang.HangWatch(match, self.o.hang_timeout, "restart", self.ranks_dir, self.o.job_dir,
                              lambda: self.alloc.on_nodes(hang.probe_argv(match), attempt.nodes), lambda _what: None,
                              lambda line: print(line, flush=True), runner=self.runner,
                              acting=f"stop this attempt (--max-restarts {self.o.max_restarts}: the supervisor decides "
                                     "whether it restarts)")

    def _judge(self, rc: int, attempt: Attempt, sizes: dict[str, int]) -> Outcome:
        """The step ended by itself: success, or the class its ranks' new lines show."""
        if rc == 0:
            return Outcome(None, 0)
        dead = [h for h in attempt.nodes if not self.alloc.alive(h)]
        if dead:  # the step ended because a node died: Slurm's SIGTERM to the rest made any stop file
            return Outcome("node-failure", rc, dead, detail=f"{','.join(dead)} unreachable", teardown=True)
        return classify_attempt(self.ranks_dir, sizes, rc)


def main(opts: Options) -> int:
    try:
        sup = Supervisor(opts)
        try:
            return sup.run()
        finally:
            free_memory(sup.alloc, sup.env, sup.job, say)
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # the job must end with a reason, not a bare traceback in slurm.out
        print(f"torchhpc: supervisor: failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return 1
