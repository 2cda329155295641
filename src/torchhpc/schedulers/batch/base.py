"""The batch-script backend: one script shape for every queueing scheduler (Slurm, PBS).

A batch script is always the same story, told once here::

    header -> directives -> set -euo pipefail -> (traps) -> setup + env
    -> rendezvous (host list, MASTER_ADDR, MASTER_PORT) -> network presets/detection
    -> per-task shim -> stop protocol -> launch -> wait -> exit status

A backend (:mod:`~torchhpc.schedulers.slurm.slurm`, :mod:`~torchhpc.schedulers.pbs.pbs`) supplies
only data and parsers: directives, the job id's variable, the host list, the launch step, how it is
warned before the end (Slurm signals; PBS does not, the script keeps a timer), the submit argv.

The script's own variables start with ``_torchhpc_`` (refused in ``--env``): a user's are never overwritten.
The stop protocol's helpers are written by :mod:`~torchhpc.schedulers.batch.stop`, the launch under the
in-allocation supervisor by :mod:`~torchhpc.schedulers.batch.supervised`.
"""

from __future__ import annotations

import os
import re
import sys
from abc import abstractmethod
from typing import Any, ClassVar

from torchhpc.core.shell import wrap_command
from torchhpc.core.spec import JobSpec
from torchhpc.core.units import counted
from torchhpc.errors import SchedulerError
from torchhpc.jobdir.files import keep, make_dirs, write_new, write_same
from torchhpc.jobdir.log_wiring import job_dir
from torchhpc.jobdir.record import dependency_record, new_record, save_record
from torchhpc.launchers import launcher_of
from torchhpc.schedulers.api import Scheduler, Submission
from torchhpc.schedulers.batch.script import (
    boot_lines,
    env_block,
    header_lines,
    indent_setup,
    job_boot,
    read_log,
    script_path,
)
from torchhpc.schedulers.batch.step import array_lines, launch_breaks
from torchhpc.schedulers.batch.stop import indent, stop_helper_lines
from torchhpc.schedulers.batch.supervised import supervised_lines

__all__ = ["PREFIX", "BatchScheduler"]

# Shell variables of the script itself (never a user's): see the module docstring.
PREFIX = "_torchhpc_"

# MASTER_ADDR, defined once in every script's helpers and called as `_torchhpc_master_addr HOST`.
MASTER_ADDR_LINES = (
    "# MASTER_ADDR unless set: the host's IPv4 (TCPStore prefers one), else its name (|| true: not fatal under pipefail).",
    "_torchhpc_master_addr() {",
    '  MASTER_ADDR="${MASTER_ADDR:-$( (getent ahostsv4 "$1" || true) | awk \'NR==1{print $1}\')}"',
    '  MASTER_ADDR="${MASTER_ADDR:-$1}"',
    "}",
)


class BatchScheduler(Scheduler):
    """The shared batch script; subclasses fill in the data and the few hooks below."""

    # capabilities (schedulers/capabilities.py): a batch script can requeue itself and run arrays
    supports_requeue = True
    supports_arrays = True
    renders_script = True

    # -- data a backend supplies ---------------------------------------------
    suffix: ClassVar[str] = ".sh"
    how_to_submit: ClassVar[str] = ""
    # the job id as the script sees it (for the stop file's name)
    job_id_ref: ClassVar[str] = ""
    # this array task's index as the batch shell sees it (Slurm: "$SLURM_ARRAY_TASK_ID")
    array_index_ref: ClassVar[str] = ""
    # "{spec}"-free description for the start line, e.g. "$SLURM_JOB_ID on $SLURM_JOB_NODELIST"
    job_label: ClassVar[str] = ""
    # stop protocol: traps before anything else (a warning may come early) or just before the step
    traps_first: ClassVar[bool] = True
    stop_comment: ClassVar[str] = ""
    # (reason, signal) pairs trapped by the batch shell
    stop_traps: ClassVar[tuple[tuple[str, str], ...]] = ()
    stop_words: ClassVar[dict[str, str]] = {}  # what the batch shell says for a reason whose word is jargon

    # -- hooks -----------------------------------------------------------------
    def check(self, spec: JobSpec) -> None:
        """Reject what this scheduler cannot run (before anything is rendered)."""
        launcher_of(spec).check(self.name)

    @abstractmethod
    def directives(self, spec: JobSpec) -> list[str]:
        """The directive lines (``#SBATCH ...``, ``#PBS ...``), each through ``core.shell.directive``."""

    def preamble_lines(self, spec: JobSpec) -> list[str]:
        """Lines right after ``set -euo pipefail`` (e.g. PBS: the node file check and the cd)."""
        return []

    @abstractmethod
    def host_lines(self, spec: JobSpec) -> list[str]:
        """Rendezvous, part 1: list the hosts, set ``_torchhpc_master_host`` (and the node count)."""

    @abstractmethod
    def port_lines(self, spec: JobSpec) -> list[str]:
        """Rendezvous, part 2: MASTER_PORT from the job id unless the user set it."""

    def exported(self) -> str:
        return "MASTER_ADDR MASTER_PORT"

    def check_lines(self, spec: JobSpec) -> list[str]:
        """Lines after the start line (e.g. PBS: warn when the node file has fewer hosts)."""
        return []

    def stop_env_lines(self, spec: JobSpec) -> list[str]:
        """Extra exports of the stop protocol (e.g. Slurm's restart count)."""
        return []

    def before_step_lines(self, spec: JobSpec) -> list[str]:
        """Lines just before the step starts in the background (e.g. PBS's walltime timer)."""
        return []

    def after_step_lines(self, spec: JobSpec) -> list[str]:
        """Lines after the step ended, before ``exit`` (e.g. Slurm's requeue)."""
        return []

    @abstractmethod
    def launch_lines(self, spec: JobSpec) -> list[str]:
        """The step(s) that start the ranks: what this scheduler asks of the job's launcher."""

    @abstractmethod
    def submit_argv(self, path: str) -> tuple[str, ...]:
        """The command that submits the script written at ``path``."""

    @abstractmethod
    def parse_job_id(self, stdout: str) -> str:
        """The job id in the submit command's output ("" when it printed none)."""

    def record(self, spec: JobSpec) -> dict[str, Any]:
        """What ``logs``/``status`` need later, saved beside the job id: fields of :class:`JobRecord`."""
        return {}

    submit_hint: ClassVar[str] = ""
    # why no log file may be known yet (the hint of the error)
    no_log_hint: ClassVar[str] = ""

    @abstractmethod
    def rank_lines(self, job_id: str, text: str, rank: int) -> str:
        """One rank's lines of the job's log (each launcher tags its lines its own way)."""

    def log_lines(self, spec: JobSpec) -> list[str]:
        """Where each rank's output goes (``$TORCHHPC_RANKS_DIR``), if this backend keeps per-rank files."""
        return []

    def standby_lines(self, spec: JobSpec) -> list[str]:
        """Warm starts without the supervisor (boot/standby.sh), where this backend has them."""
        return []

    # -- the script --------------------------------------------------------------
    @staticmethod
    def stopping(spec: JobSpec) -> bool:
        return bool(spec.stop_signal_seconds or spec.requeue)

    def render_script(self, spec: JobSpec) -> str:
        """The script, in the order a person reads a seed's: directives, then ``main()`` (setup,
        rendezvous, one launch command wrapped at its arguments), then torchhpc's helpers, marked
        as generated, and ``main "$@"`` on the last line (bash needs a function defined before it runs).

        By hand (``sbatch``/``qsub`` of the file) it runs too; where its boot directory is missing, without
        the exit cures, said in one line (script.boot_lines).
        """
        self.check(spec)
        lines = header_lines("#!/bin/bash", self.how_to_submit)
        lines.append("# Set-up, then the job as main(), top-down; torchhpc's helpers follow it; the last line runs it.")
        lines += self.directives(spec)
        end_dir = self.end_dir_words(spec)
        lines += ["", "set -euo pipefail", "", *boot_lines(spec, ends=bool(end_dir))]
        if end_dir:
            from torchhpc.jobdir.endmark import end_lines

            lines += end_lines(end_dir, self.restart_ref, cancel_trap=not self.stopping(spec),
                               own_code_files=self.own_code_files(spec))
        lines += ["", "main() {"]
        body: list[str] = [*self.preamble_lines(spec), *self.container_setup_lines(spec)]
        lines += indent(body)
        # module lines run outside `set -u` (Lmod reads unset variables); a heredoc's body stays as written
        lines += indent_setup(env_block(spec))
        body = []
        if spec.array is not None:
            more, spec = array_lines(spec, self.array_index_ref)
            body += ["", *more]
        body += [
            "",
            *self.host_lines(spec),
            '_torchhpc_master_addr "$_torchhpc_master_host"',
            *self.port_lines(spec),
            f"export {self.exported()}",
            *self.network_lines(spec),
            f'echo "torchhpc: job {self.job_label}, master $MASTER_ADDR:$MASTER_PORT, '
            f'launcher {spec.launcher}, {counted(spec.nodes, "node")} x {counted(spec.nproc_per_node, "rank")}"',
            *self.check_lines(spec),
            *self.log_lines(spec),
            *self.standby_lines(spec),
            "",
        ]
        launcher = launcher_of(spec)
        launch = self.launch_lines(spec)
        stopping = self.stopping(spec)
        body.append(f"# Launch: {launcher.summary}.")
        if stopping:
            body.append(self.stop_comment)
            if not self.traps_first:
                body.append("_torchhpc_arm_stop")
        if spec.supervised:
            body += supervised_lines(spec, launch, stopping)
        for i, line in enumerate([] if spec.supervised else launch):
            wrapped = [x[2:] for x in wrap_command(line, launch_breaks(line, spec))]
            if stopping and i == len(launch) - 1:
                wrapped[-1] += " &"
            body += wrapped
        if stopping:
            body += ["_torchhpc_wait_step", 'exit "$_torchhpc_rc"']
        lines += indent(body)
        lines += ["}", "", *self.helper_section(spec, launch)]
        at = lines.index("main() {")
        if lines[at + 1] == "":
            del lines[at + 1]
        return "\n".join(lines) + "\n"

    def helper_section(self, spec: JobSpec, launch: list[str]) -> list[str]:
        """What ``main()`` calls, defined once: rendezvous and the stop protocol (the end marker, the log wrapper
        and the task shim are files of the boot directory, set up before ``main``)."""
        lines = [
            "# " + "-" * 18 + " Generated by torchhpc: the helpers main() uses. Re-render rather than edit.",
            "",
            *MASTER_ADDR_LINES,
            *self.helper_lines(spec),
        ]
        stopping = self.stopping(spec)
        if stopping:
            lines += ["", *self.stop_helper_lines(spec)]
        lines.append("")
        if stopping and self.traps_first:  # a warning that comes early must not kill the shell by default action
            lines.append("_torchhpc_arm_stop  # before main: Slurm may warn before main's first line")
        lines.append('main "$@"')
        return lines

    # the scheduler's restart count as the batch shell sees it (the end marker's "restart")
    restart_ref: ClassVar[str] = "0"

    def end_dir_words(self, spec: JobSpec) -> str | None:
        """Shell words for the job's directory, where the script leaves its end marker
        (:mod:`~torchhpc.jobdir.endmark`); None: no directory known to the script, no marker."""
        return None

    def own_code_files(self, spec: JobSpec) -> str:
        """Shell words naming the batch output where the launcher reported each task's own end, read when
        the launcher's status hides the first failure's code (``end_lines``); "" where it does not."""
        return ""

    def end_dir(self, job_id: str) -> str | None:
        """Where this job's end marker appears, when this machine sees the job's output directory."""
        from torchhpc.jobdir.logs import task_record

        d = task_record(self.name, job_id).job_dir
        return d if d and os.path.isdir(os.path.dirname(d)) else None

    def helper_lines(self, spec: JobSpec) -> list[str]:
        """A backend's own helpers (e.g. Slurm's port probe), after the shared ones."""
        return []

    def container_setup_lines(self, spec: JobSpec) -> list[str]:
        if spec.container is None:  # the containers package only when a job has one: submitting stays light
            return []
        from torchhpc.containers import setup_lines

        return setup_lines(spec.container)

    def network_lines(self, spec: JobSpec) -> list[str]:
        """``--network``: the presets with setdefault semantics, then ``auto`` detection on the first node.

        The batch shell runs on the host (``scontrol``/``python`` are rarely in
        containers), with the submitting interpreter, which has torchhpc.
        """
        if not spec.network:
            return []
        from torchhpc.network.presets import script_lines

        return script_lines(spec.network, python=sys.executable or "python3", master_var="MASTER_ADDR")

    def stop_helper_lines(self, spec: JobSpec) -> list[str]:
        """Time limit and preemption: the stop protocol's helpers (batch/stop.py), with this backend's
        job id, exports, signals and what follows the step."""
        arm = [*self.stop_env_lines(spec), *self.before_step_lines(spec)]
        return stop_helper_lines(spec, self.job_id_ref, arm, self.stop_traps, self.stop_words, self.after_step_lines(spec))

    # -- submission ----------------------------------------------------------------
    def _render(self, spec: JobSpec) -> Submission:
        script = self.render_script(spec)
        path = script_path(spec, self.suffix)
        return Submission(
            scheduler=self.name,
            spec=spec,
            argv=self.submit_argv(path),
            script=script,
            script_path=path,
            files=((path, script), *job_boot(spec)[1]),  # the boot copy, where the job's Python lacks torchhpc
        )

    def schedule(self, submission: Submission) -> str:
        """Submit the script from a private file, then give it its place in the job's directory.

        The script's display name (``<output-dir>/<name>.sbatch``) may be the user's own file:
        it is never written (schedulers/files.py). A submission that fails removes what it made.
        """
        path = submission.script_path or ""
        # the boot copy (script.job_boot) at its content's name, shared by jobs; then the script, privately
        boot = [write_same(p, text) for p, text in submission.files if p != path]
        written = write_new([f for f in submission.files if f[0] == path], private=True)
        tmp = written.paths.get(path, path)
        argv = list(submission.argv)
        if path and argv and argv[-1] == path:
            argv[-1] = tmp
        try:
            done = self.runner.run(argv, hint=self.submit_hint)
            job_id = self.parse_job_id(done.stdout)
            if not job_id:
                raise SchedulerError(f"{self.submit_command} printed {done.stdout.strip()!r}, not a job id")
            script = self.place_script(submission, job_id, tmp) if path else ""
        except BaseException:
            for made in [written, *reversed(boot)]:  # last first: the first made the boot copy's directory
                made.remove()
            raise
        spec = submission.spec
        save_record(new_record(
            self.name,
            job_id,
            launcher=spec.launcher.value,
            nproc_per_node=spec.nproc_per_node,
            script=script,
            **self.record(spec),
            **dependency_record(spec),
        ))
        return job_id

    def place_script(self, submission: Submission, job_id: str, tmp: str) -> str:
        """Where the submitted script is kept: ``job<suffix>`` in the job's directory ``<name>-<id>/``.

        The directory is made if missing; a file already there stays, and the script keeps its
        private name beside the display name.
        """
        where = job_dir(submission.script_path or "", re.sub(r"[^0-9A-Za-z_]", "", job_id.split(".")[0]))
        make_dirs(where)
        return keep(tmp, os.path.join(where, "job" + self.suffix))

    def logs(self, job_id: str, rank: int | None = None) -> str:
        """The job's log: its output file and per-rank files (``[rankN]: ``), or one rank's lines."""
        from torchhpc.jobdir.logs import job_log, log_text

        log = job_log(self.name, job_id)
        if log is not None and log.ranks_dir:
            return log_text(log, rank)
        paths = self.log_paths(job_id)
        if not paths:
            raise SchedulerError(f"no log file known for {self.name} job {job_id}", self.no_log_hint)
        text = read_log(paths[0])
        if rank is None or not text:
            return text
        return self.rank_lines(job_id, text, rank)
