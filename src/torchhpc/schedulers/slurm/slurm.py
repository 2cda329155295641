"""The Slurm backend: an sbatch script per job, squeue/scontrol/sacct for state.

Geometry is where users lose days, so it is derived, never typed twice:
torchrun is one task per node with all local processes' CPUs; srun-direct and
mpirun are one task per process. MASTER_ADDR is the first node's IPv4 (torch's
TCPStore and c10d rendezvous are happiest with an address), MASTER_PORT is
derived from the job id so every rank computes the same value without talking
and two jobs on one node do not collide.

The launch step itself, for each launcher, is written by :mod:`~torchhpc.schedulers.slurm.launch`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, ClassVar

from torchhpc.core.depend import dependency_value
from torchhpc.core.proc import Runner
from torchhpc.core.shell import directive, join, quote
from torchhpc.core.spec import JobSpec
from torchhpc.core.units import format_bytes, format_walltime, parse_size, parse_switch
from torchhpc.errors import CommandError, SchedulerError, SpecError
from torchhpc.jobdir.files import keep
from torchhpc.jobdir.log_wiring import (
    LOG_DIR_VAR,
    RANKS_DIR,
    job_dir,
    make_ranks_dir_lines,
    ranks_dir_ref,
)
from torchhpc.jobdir.record import update_record
from torchhpc.launchers import launcher_of
from torchhpc.schedulers.allocation import Allocation
from torchhpc.schedulers.api import Submission
from torchhpc.schedulers.batch.base import BatchScheduler
from torchhpc.schedulers.batch.script import script_path
from torchhpc.schedulers.options import Option, declare
from torchhpc.schedulers.slurm.launch import container_srun_options, standby_lines, step_lines, wrap
from torchhpc.schedulers.slurm.parse import parse_scontrol
from torchhpc.schedulers.slurm.site import dev_target, site_runner
from torchhpc.schedulers.slurm.status import SlurmQueries, expand_output, first_end_files, output_pattern

__all__ = ["SlurmScheduler", "expand_output", "parse_scontrol"]

# The shell form of torchhpc.env's derive_port(): keep the two in step.
PORT_EXPR = "$(( 10000 + SLURM_JOB_ID % 20000 ))"
PORT_EXPR_TRY = "$(( 10000 + (SLURM_JOB_ID + _torchhpc_try * 7919) % 20000 ))"


class SlurmScheduler(SlurmQueries, BatchScheduler):
    name = "slurm"
    submit_command = "sbatch"
    supports_interactive_shell = True  # salloc (torchhpc shell)
    supports_rank_probe = True  # srun --overlap into the allocation
    supports_spares = True  # the in-allocation supervisor (torchhpc.supervisor, docs/resilience.md)
    supports_restarts = True
    supports_shrink = True  # the supervisor's next attempt on the nodes that are left (--min-nodes)
    clients = ("sbatch", "srun", "scontrol", "squeue", "scancel")

    def watches_hangs(self, spec: JobSpec) -> bool:
        return spec.supervised  # the supervisor runs with --hang-timeout (batch/supervised.py)

    def allocation_of(self, job_id: str, env: Mapping[str, str] | None = None) -> Allocation:
        from torchhpc.schedulers.slurm.allocation import SlurmAllocation

        return SlurmAllocation(self, job_id, env)
    env_options: ClassVar[Mapping[str, str]] = {"account": "SBATCH_ACCOUNT"}
    suffix = ".sbatch"
    how_to_submit = "sbatch <this file>  (or: torchhpc run --scheduler slurm ...)"
    submit_hint = "is this a Slurm login node? `sinfo` should answer"
    no_log_hint = "logs are found for jobs submitted by torchhpc on this machine, or while the job is known to scontrol"
    job_id_ref = "$SLURM_JOB_ID"
    array_index_ref = '"$SLURM_ARRAY_TASK_ID"'
    job_label = "$SLURM_JOB_ID on $SLURM_JOB_NODELIST"
    stop_comment = (
        "# Nothing lost: on the time-limit warning (USR2) or the job's end (TERM) ask every rank to checkpoint and stop."
    )
    # B: only the batch shell gets USR2 (--signal=B:USR2@N): no rank, torchrun agent or NCCL ever sees it.
    stop_traps = (("time-limit", "USR2"), ("ended-by-slurm", "TERM"))
    stop_words: ClassVar[dict[str, str]] = {"ended-by-slurm": "Slurm is ending the job (scancel, its time limit or a requeue)"}
    OPTIONS = declare(
        Option("partition", "Slurm partition (--partition)"),
        Option("account", "account to charge (--account); mandatory on many sites"),
        Option("qos", "quality of service (--qos)"),
        Option("reservation", "reservation name (--reservation)"),
        Option("constraint", "node features (--constraint)"),
        Option("exclusive", "request whole nodes (--exclusive)", "bool", "0"),
        Option("gres", "generic resources instead of --gpus-per-node, e.g. gpu:4 (--gres)"),
        Option("nodelist", "run on these nodes (--nodelist)"),
        Option("exclude", "avoid these nodes (--exclude)"),
        Option("mail_user", "e-mail address (--mail-user)"),
        Option("mail_type", "when to mail (--mail-type)", default="END,FAIL"),
        Option("cpu_bind", "srun --cpu-bind value, e.g. mask_cpu:0xfe... (LUMI)"),
        Option("max_restarts", "torchrun --max-restarts (0: fail fast)", "int", "0"),
        Option("sbatch_extra", "extra raw sbatch flags, space separated (e.g. '--gpus-per-task=1')"),
    )

    def __init__(self, runner: Runner | None = None) -> None:
        self._site = runner is None  # its commands go where site_env says (a given runner: where it says)
        super().__init__(runner or site_runner())

    @classmethod
    def native_flag(cls, word: str) -> str | None:
        from torchhpc.schedulers.slurm.flags import native_flag

        return native_flag(word, cls.OPTIONS)

    def target(self) -> str | None:
        return dev_target() if self._site else None

    # rendering -------------------------------------------------------
    def allocation(self, spec: JobSpec, opts: Mapping[str, str]) -> list[tuple[str, object]]:
        """What the job asks Slurm for, as (flag, value) pairs (value None: a bare flag): the one
        source of ``#SBATCH`` resource lines and of ``salloc``'s flags (``torchhpc shell``)."""
        pairs: list[tuple[str, object]] = [
            ("nodes", spec.nodes + spec.spares),
            ("ntasks-per-node", launcher_of(spec).tasks_per_node(spec)),
            # per process for srun/mpirun, for all local processes for torchrun
            ("cpus-per-task", launcher_of(spec).cpus_per_task(spec)),
        ]
        if spec.gpus_per_node and not opts.get("gres"):
            pairs.append(("gpus-per-node", spec.gpus_per_node))
        if spec.mem:
            pairs.append(("mem", format_bytes(parse_size(spec.mem, "--mem"))))
        if spec.time_seconds:
            pairs.append(("time", format_walltime(spec.time_seconds)))
        keys = ("partition", "account", "qos", "reservation", "constraint", "gres", "nodelist", "exclude")
        return pairs + [(key, opts[key]) for key in keys if opts.get(key)]

    def directives(self, spec: JobSpec) -> list[str]:
        """The ``#SBATCH`` lines, each through :func:`~torchhpc.core.shell.directive`."""
        opts = self.settings(spec)
        pairs: list[tuple[str, object]] = [("job-name", spec.name), *self.allocation(spec, opts)]
        if opts.get("mail_user"):
            pairs.append(("mail-user", opts["mail_user"]))
            pairs.append(("mail-type", opts["mail_type"]))
        arr = spec.array_spec
        if arr is not None:
            pairs.append(("array", arr.slurm()))
        pairs.append(("output", output_pattern(spec)))
        if spec.after:
            # kill-on-invalid-dep: a dependency that can never be met (--after-ok of a failed job) ends this job,
            # reason DependencyNeverSatisfied, instead of leaving it pending forever (core/depend.py).
            pairs += [("dependency", dependency_value(spec.after)), ("kill-on-invalid-dep", "yes")]
        stop = spec.stop_signal_seconds
        if stop:
            # B: only the batch shell gets it: no rank, torchrun agent or NCCL ever sees USR2.
            pairs.append(("signal", f"B:USR2@{stop}"))
        if spec.requeue:
            pairs += [("open-mode", "append"), ("requeue", None)]
        lines = [directive("#SBATCH", k, v) for k, v in pairs]
        if spec.supervised:  # a failed node must not end the job: the supervisor goes on without it
            lines.append(directive("#SBATCH", "no-kill"))
        if parse_switch(opts["exclusive"], "exclusive"):
            lines.append(directive("#SBATCH", "exclusive"))
        for flag in (opts.get("sbatch_extra") or "").split():
            if not flag.startswith("--"):
                raise SpecError(f"sbatch_extra flag {flag!r} must look like --name=value")
            key, _, value = flag[2:].partition("=")
            lines.append(directive("#SBATCH", key, value or None))
        return lines

    def launch_lines(self, spec: JobSpec) -> list[str]:
        """The job step(s) that start the ranks, for the chosen launcher (slurm/launch.py)."""
        return step_lines(spec)

    def standby_lines(self, spec: JobSpec) -> list[str]:
        return standby_lines(spec)

    def log_lines(self, spec: JobSpec) -> list[str]:
        if spec.array is not None:
            # Every task is its own job (ARRAY_TASK): the submitter cannot make the task directories, so
            # the batch shell makes its own. Slurm's output stays in <output-dir>/<name>-ARRAY_TASK.out.
            ref = "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"
            return [
                "# Each rank's stdout and stderr go to its own file, written by the rank itself (whole lines,",
                "# whatever the launcher does with its pipes): <output-dir>/<name>-<array id>_<task>/ranks/rank-N@NODE.log.",
                *make_ranks_dir_lines(script_path(spec, self.suffix), ref),
            ]
        return [
            "# Each rank's output into its own file, whole lines: <job dir>/ranks/rank-N@NODE.log (`torchhpc logs`).",
            "# torchhpc creates it when it submits; by hand (`sbatch FILE`) the output stays in Slurm's file.",
            f"export {LOG_DIR_VAR}={ranks_dir_ref(script_path(spec, self.suffix), '$SLURM_JOB_ID')}",
            f'if [ -d "${LOG_DIR_VAR}" ]; then echo "torchhpc: rank output in ${LOG_DIR_VAR}"; fi',
        ]

    restart_ref = "${SLURM_RESTART_COUNT:-0}"

    def end_dir_words(self, spec: JobSpec) -> str | None:
        """The job's directory (an array task's own: ``<name>-ARRAY_TASK``), for its end marker."""
        from torchhpc.jobdir.endmark import quoted_dir

        prefix = os.path.splitext(script_path(spec, self.suffix))[0] + "-"
        ref = "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}" if spec.array is not None else "$SLURM_JOB_ID"
        return quoted_dir(prefix, ref)

    def own_code_files(self, spec: JobSpec) -> str:
        return first_end_files(spec)

    def _render(self, spec: JobSpec) -> Submission:
        """Submitted held, with its output in the job's directory (made once the id is known)."""
        sub = super()._render(spec)
        if not sub.script_path:
            return sub
        if spec.array is not None:
            note = (
                f"task directories: {job_dir(sub.script_path, '<array id>_<task>')}/ranks/rank-N@NODE.log"
                " (each task's batch shell makes its own); Slurm's output per task: "
                + expand_output(output_pattern(spec), spec.name, "<array id>_<task>")
            )
            return replace(sub, notes=(*sub.notes, note))
        path = sub.script_path
        out = job_dir(path, "").replace("%", "%%") + "%j/slurm.out"  # overrides the script's own (for `sbatch FILE`)
        note = (
            f"job directory: {job_dir(path, '<job id>')}/ (job.sbatch, slurm.out, ranks/), made while the job is held"
            " (then `scontrol release`)"
        )
        kept = f"the script above is kept in that directory as job.sbatch; no {os.path.basename(path)} is left behind"
        return replace(sub, argv=(*sub.argv[:-1], "--hold", f"--output={out}", sub.argv[-1]),
                       notes=(*sub.notes, note, kept))

    def schedule(self, submission: Submission) -> str:
        """Submit held, make the job's directory (its name needs the id), put the script in, release.

        Slurm does not create an output file's directory, and a job may start the
        moment ``sbatch`` returns: hence ``--hold``. The job is released whatever happens,
        unless the user asked for a held job themselves (``--opt sbatch_extra=--hold``).
        """
        job_id = super().schedule(submission)
        if "--hold" not in submission.argv:
            return job_id
        user_hold = "#SBATCH --hold" in (submission.script or "").splitlines()
        try:
            where = job_dir(submission.script_path or "", job_id)
            update_record(self.name, job_id, job_dir=where, output_path=os.path.join(where, "slurm.out"))
        finally:
            if not user_hold:
                self.runner.run(["scontrol", "release", job_id], hint="release it by hand: scontrol release " + job_id)
        return job_id

    def place_script(self, submission: Submission, job_id: str, tmp: str) -> str:
        """A held job's directory is made here, and must be new: an old one (a job id used again
        after a cluster was rebuilt, or the user's own) is never written into; the job is cancelled
        before it runs, and the submission refused."""
        if "--hold" not in submission.argv:
            return super().place_script(submission, job_id, tmp)
        where = job_dir(submission.script_path or "", job_id)
        try:
            os.mkdir(where)
        except FileExistsError:
            with contextlib.suppress(CommandError):
                self.runner.run(["scancel", job_id], timeout=60)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise SchedulerError(
                f"the job directory {where} already exists: job {job_id} was cancelled before it ran, "
                "so that nothing writes into it",
                "give the job another --name or --output-dir, or move that directory away",
            ) from None
        os.mkdir(os.path.join(where, RANKS_DIR))
        return keep(tmp, os.path.join(where, "job.sbatch"))

    def host_lines(self, spec: JobSpec) -> list[str]:
        return [
            "# Rendezvous: the first node's IPv4 and a port derived from the job id (same on every rank).",
            '_torchhpc_hosts="$(scontrol show hostnames "$SLURM_JOB_NODELIST")"',
            "_torchhpc_master_host=\"${_torchhpc_hosts%%$'\\n'*}\"",
        ]

    def port_lines(self, spec: JobSpec) -> list[str]:
        return ["_torchhpc_master_port"]

    def helper_lines(self, spec: JobSpec) -> list[str]:
        return [
            "# MASTER_PORT unless set: from the job id, moved while something listens on it here (the first node).",
            "_torchhpc_master_port() {",
            '  if [ -n "${MASTER_PORT:-}" ]; then return; fi',
            "  for _torchhpc_try in 0 1 2 3 4 5 6 7; do",
            f"    MASTER_PORT={PORT_EXPR_TRY}",
            '    ss -Hltn "( sport = :$MASTER_PORT )" 2>/dev/null | grep -q . || break',
            "  done",
            "}",
        ]

    def stop_env_lines(self, spec: JobSpec) -> list[str]:
        """Slurm may send the warning up to a minute early (its timer runs every 30 s), possibly
        before the first line of the script ran, so the traps come first (``traps_first``): bash's
        default action for USR2 would end the job.

        SIGTERM to the batch shell means Slurm is ending the job (``scancel``,
        the hard time limit, ``scontrol requeue``): the ranks are told to save at
        once, but the shell does not requeue, so a user's cancel sticks.
        Preemption's grace-time SIGTERM goes to the ranks only; they create the
        stop file themselves, and that is how the shell learns to requeue.
        """
        return ['export TORCHHPC_RESTART_COUNT="${SLURM_RESTART_COUNT:-0}"']

    def before_step_lines(self, spec: JobSpec) -> list[str]:
        out = os.path.abspath(spec.output_dir)
        return [f'_torchhpc_timeouts_file={quote(os.path.join(out, ".torchhpc-timeouts-"))}"$SLURM_JOB_ID"']

    def after_step_lines(self, spec: JobSpec) -> list[str]:
        """After a time-limit warning or a preemption: requeue, or end with the stop's class
        (schedulers/slurm/requeue.py)."""
        from torchhpc.schedulers.slurm.requeue import after_stop_lines

        return after_stop_lines(spec)

    def submit_argv(self, path: str) -> tuple[str, ...]:
        return ("sbatch", "--parsable", path)

    def parse_job_id(self, stdout: str) -> str:
        job_id = stdout.strip().split(";")[0]
        return job_id if job_id.isdigit() else ""

    def record(self, spec: JobSpec) -> dict[str, Any]:
        rec: dict[str, Any] = {"name": spec.name, "output": output_pattern(spec)}
        if spec.array is not None:  # its tasks' directories: <output-dir>/<name>-ARRAY_TASK (log_lines)
            rec["array"] = True
        return rec

    def container_setup_lines(self, spec: JobSpec) -> list[str]:
        """The runtime's set-up; what each node needs (enroot create into its node-local data path)
        runs once per node of the allocation, before the launch."""
        lines = super().container_setup_lines(spec)
        if spec.container is None:
            return lines
        from torchhpc.containers import per_node_lines

        per_node = per_node_lines(spec.container)
        each = 'srun --ntasks="${SLURM_NNODES:-1}" --ntasks-per-node=1 --kill-on-bad-exit=1 \\\n    '  # a long image name: 2 lines
        return [
            *(line for line in lines if line not in per_node),
            *(each + join(["bash", "-c", line]) for line in per_node),
        ]

    def shell_argv(self, spec: JobSpec) -> list[str]:
        """The seeds' interactive workflow: an allocation with a shell on the first node."""
        self.check(spec)
        opts = self.settings(spec)
        argv = ["salloc", *(f"--{key}={value}" for key, value in self.allocation(spec, opts))]
        if parse_switch(opts["exclusive"], "exclusive"):
            argv.append("--exclusive")
        # --overlap (Slurm >= 20.11): the shell's step shares its CPUs, so an srun (or a torchhpc
        # run) typed inside the shell starts at once instead of waiting for the shell to end.
        inner = ["srun", "--overlap", "--pty", *container_srun_options(spec)]
        shell = wrap(spec, ["bash", "-i"], interactive=True) if spec.container else ["bash", "-i"]
        loads = [line for line in spec.setup if line.startswith("module ")]
        if loads:
            # The profile's modules load on the compute node (LUMI picks its partition/G modules
            # there), before the runtime they provide starts and before $SIF, which they set, expands.
            shell = ["bash", "-c", " && ".join([*loads, "exec " + join(shell)])]
        return argv + inner + shell
