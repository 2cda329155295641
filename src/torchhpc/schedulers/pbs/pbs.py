"""The PBS backend (PBS Pro / OpenPBS, and Torque-style sites): a ``#PBS`` script, ``qsub``, ``qstat``.

The launch follows the UBC Sockeye guide (the HPC_helper guide): on PBS, ``mpirun + python``
started once on the first node is the way that works; each MPI process is one
rank. ``--oversubscribe`` because PBS gives OpenMPI one slot per ``mpiprocs``
(one per chunk by default) and a GPU rank is not a CPU slot; ``--bind-to none``
because PyTorch runs its own thread pools; ``-x`` forwards the rendezvous
variables, which ``mpirun`` does not do by itself. The per-task shim maps
``OMPI_COMM_WORLD_*`` to torch's ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``.

``--launcher torchrun`` is the alternative: one torchrun per node, started with
``pbsdsh`` (PBS's own task spawner, no ssh) or with ``mpirun`` one per node.

MASTER_ADDR is the first host of ``$PBS_NODEFILE`` (deduplicated, order kept:
PBS lists a host once per MPI slot), MASTER_PORT is ``10000 + N % 20000`` with N
the digits of ``$PBS_JOBID`` -- every rank computes the same value unaided.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from torchhpc.core.depend import dependency_value
from torchhpc.core.shell import Raw, directive, join
from torchhpc.core.spec import JobSpec, default_python
from torchhpc.core.units import parse_size, parse_switch
from torchhpc.errors import QuotingError, SpecError
from torchhpc.jobdir.log_wiring import LOG_DIR_VAR, LOG_REF, job_dir, log_argv, make_ranks_dir_lines
from torchhpc.jobdir.record import update_record
from torchhpc.launchers import TASK_REF, launcher_of, mpirun_argv, task_argv
from torchhpc.launchers.boot import BOOT_VAR
from torchhpc.schedulers.allocation import Allocation
from torchhpc.schedulers.api import Submission
from torchhpc.schedulers.batch.base import BatchScheduler
from torchhpc.schedulers.batch.script import script_path
from torchhpc.schedulers.batch.step import in_container, job_env_names, torchrun_command
from torchhpc.schedulers.options import Option, declare
from torchhpc.schedulers.pbs.status import PBSQueries

__all__ = ["PORT_EXPR", "PBSScheduler", "job_name", "pbs_size", "pbs_walltime"]

# Same derivation as the Slurm backend, from the numeric part of the PBS job id.
PORT_EXPR = "$(( 10000 + 10#${_torchhpc_jobnum:-0} % 20000 ))"
RENDEZVOUS_VARS = ("MASTER_ADDR", "MASTER_PORT")

# Right after `set -euo pipefail`.
PREAMBLE = r"""
: "${PBS_NODEFILE:?not inside a PBS job: submit this script with qsub}"
# PBS starts the script in $HOME; run where qsub was called, like sbatch does.
cd "${PBS_O_WORKDIR:-.}"
""".strip("\n")

HOSTS = r"""
# Rendezvous: the first host of $PBS_NODEFILE (listed once per MPI slot: deduplicate,
# keep the order) as an IPv4 address, and a port derived from the job id's digits.
mapfile -t _torchhpc_hosts < <(awk '!seen[$0]++' "$PBS_NODEFILE")
NNODES=${#_torchhpc_hosts[@]}
_torchhpc_master_host=${_torchhpc_hosts[0]}
""".strip("\n")
# qsub -N: PBS Pro allows up to 236 printable non-space characters, first one alphabetic.
_BAD_NAME = re.compile(r"[^A-Za-z0-9_.+-]")


def pbs_size(text: str, source: str = "--mem") -> str:
    """``16G`` -> ``16gb``: PBS sizes are lowercase ``kb/mb/gb/tb`` with binary multiples."""
    n = parse_size(text, source)
    units = (("tb", 1024**4), ("gb", 1024**3), ("mb", 1024**2), ("kb", 1024))
    return next((f"{n // f}{unit}" for unit, f in units if n >= f and n % f == 0), f"{n}b")


def _wrap(spec: JobSpec, argv: list[str]) -> list[str]:
    """Run ``argv`` inside the job's container, one container per rank (or per node for torchrun)."""
    if spec.container is not None and spec.container.runtime in ("pyxis", "enroot"):
        raise SpecError(
            f"--runtime {spec.container.runtime} is not available with --scheduler pbs",
            "pyxis needs srun; use --runtime apptainer (or singularity, charliecloud, podman)",
        )
    return in_container(spec, argv, [*RENDEZVOUS_VARS, "NNODES", "OMPI_*", "PMIX_*", "PBS_*"])


def pbs_walltime(seconds: int) -> str:
    """PBS walltime is ``HH:MM:SS`` with hours past 24 (no ``D-`` prefix as Slurm has)."""
    return f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def _word(value: str, key: str) -> str:
    """A directive value PBS takes as one word (queue, account, resources): no spaces, quotes or ``#``."""
    if not value or re.search(r"[\s\"'#\\]", value):
        raise QuotingError(
            f"PBS option {key}={value!r} cannot be written in a #PBS line",
            "PBS queue, account and resource values are single words without spaces, quotes or '#'",
        )
    return value


def job_name(name: str) -> str:
    """A name qsub accepts: unsafe characters become ``_``, first character a letter."""
    safe = _BAD_NAME.sub("_", name)[:236]
    return safe if safe[:1].isalpha() else ("j" + safe)[:236]


class PBSScheduler(PBSQueries, BatchScheduler):
    name = "pbs"
    submit_command = "qsub"
    clients = ("qsub", "qstat", "qdel", "pbsdsh")
    default_launcher = "mpirun"
    suffix = ".pbs"
    how_to_submit = "qsub <this file>  (or: torchhpc run --scheduler pbs ...)"
    submit_hint = "is this a PBS login node? `qstat -B` should answer"
    query_hint = "is this a PBS login node? `qstat` should answer"
    no_log_hint = "PBS copies the output file back when the job ends; look in the job's -o directory"
    job_id_ref = "$_torchhpc_jobnum"
    array_index_ref = '"${PBS_ARRAY_INDEX:-${PBS_ARRAYID:-}}"'  # PBS Pro sets PBS_ARRAY_INDEX, Torque PBS_ARRAYID
    job_label = "$PBS_JOBID on ${_torchhpc_hosts[*]}"
    # PBS sends no warning before the walltime kill: the traps are set just before the step starts.
    traps_first = False
    stop_comment = "# Nothing lost: ask every rank to checkpoint and stop before the walltime (PBS gives no warning)."
    stop_traps = (("terminated", "TERM"),)
    supports_rank_probe = True  # pbsdsh from inside the job (schedulers/pbs/allocation.py)
    OPTIONS = declare(
        Option("queue", "queue to submit to (#PBS -q)"),
        Option("account", "project/allocation to charge (#PBS -A), e.g. st-alice-1-gpu on Sockeye"),
        Option("select_style", "pro: -l select=N:ncpus=..:ngpus=..; torque: -l nodes=N:ppn=P", "choice", "pro",
               ("pro", "torque")),
        Option("place", "PBS Pro chunk placement (#PBS -l place=), one chunk per host", default="scatter"),
        Option("select_extra", "extra chunk resources appended to select, e.g. 'gpu_mem=32gb'"),
        Option("mail", "e-mail address for job mail (#PBS -M)"),
        Option("mail_events", "when to mail (#PBS -m), when mail is set", default="abe"),
        Option("per_node", "how torchrun is started once per node", "choice", "pbsdsh", ("pbsdsh", "mpirun")),
        Option("mca", "OpenMPI MCA settings, comma separated (the seed's)", default="pml=ob1,btl=^openib"),
        Option("oversubscribe", "mpirun --oversubscribe", "bool", "1"),
        Option("max_restarts", "torchrun --max-restarts (0: fail fast)", "int", "0"),
    )

    # rendering -----------------------------------------------------------
    def _check_options(self, spec: JobSpec) -> dict[str, str]:
        opts = self.settings(spec)
        if spec.requeue:
            raise SpecError(
                "--requeue is not supported with --scheduler pbs (PBS requeue, qrerun, needs operator rights)",
                "drop --requeue: the job still stops cleanly before the walltime; resubmit to resume from the checkpoint",
            )
        return opts

    def directives(self, spec: JobSpec) -> list[str]:
        """The ``#PBS`` lines, each through :func:`~torchhpc.core.shell.directive`."""
        opts = self._check_options(spec)
        # One rule for every scheduler (Launcher.cpus_per_task): --cpus-per-proc wins over a site's cpus_per_gpu.
        launcher = launcher_of(spec)
        ncpus = launcher.cpus_per_node(spec)
        lines = [directive("#PBS", "-N", job_name(spec.name))]
        torque = opts["select_style"] == "torque"
        if torque:
            res = f"nodes={spec.nodes}:ppn={ncpus}"
            if spec.gpus_per_node:
                res += f":gpus={spec.gpus_per_node}"
            lines.append(directive("#PBS", "-l", res))
            if spec.mem:
                total = parse_size(spec.mem, "--mem") * spec.nodes
                lines.append(directive("#PBS", "-l", f"mem={pbs_size(str(total))}"))
        else:
            # MPI slots per node: one per rank for mpirun, one per node for torchrun
            chunk = [str(spec.nodes), f"ncpus={ncpus}", f"mpiprocs={launcher.tasks_per_node(spec)}"]
            if spec.gpus_per_node:
                chunk.append(f"ngpus={spec.gpus_per_node}")
            if spec.mem:
                chunk.append(f"mem={pbs_size(spec.mem)}")
            if opts.get("select_extra"):
                chunk.append(_word(opts["select_extra"], "select_extra"))
            lines.append(directive("#PBS", "-l", "select=" + ":".join(chunk)))
            lines.append(directive("#PBS", "-l", "place=" + _word(opts["place"], "place")))
        arr = spec.array_spec
        if arr is not None:  # Torque -t takes Slurm's list syntax; PBS Pro -J one range X-Y[:Z][%N]
            lines.append(directive("#PBS", "-t" if torque else "-J", arr.slurm() if torque else arr.pbs_pro()))
        if spec.time_seconds:
            lines.append(directive("#PBS", "-l", f"walltime={pbs_walltime(spec.time_seconds)}"))
        if spec.after:  # PBS deletes a job whose dependency can never be met (an afterok of a failed job)
            lines.append(directive("#PBS", "-W", "depend=" + dependency_value(spec.after)))
        for key, flag in (("account", "-A"), ("queue", "-q")):
            if opts.get(key):
                lines.append(directive("#PBS", flag, _word(opts[key], key)))
        out_dir = os.path.abspath(spec.output_dir)
        if re.search(r"[\s\"'#\\,:]", out_dir):
            raise QuotingError(
                f"--output-dir {out_dir!r} cannot be a PBS -o path",
                "PBS output paths cannot contain spaces, quotes, ',', ':' or '#'; choose another directory",
            )
        # A directory: PBS names the file JOBNAME.oSEQ inside it; stderr joined into it.
        lines.append(directive("#PBS", "-o", out_dir + "/"))
        lines.append(directive("#PBS", "-j", "oe"))
        if opts.get("mail"):
            lines.append(directive("#PBS", "-M", _word(opts["mail"], "mail")))
            lines.append(directive("#PBS", "-m", _word(opts["mail_events"], "mail_events")))
        return lines

    def _mpirun_extra(self, opts: dict[str, str]) -> list[str]:
        extra: list[str] = []
        if parse_switch(opts["oversubscribe"], "oversubscribe"):
            extra.append("--oversubscribe")
        for item in opts["mca"].split(","):
            if not item.strip():
                continue
            key, sep, value = item.strip().partition("=")
            if not sep or not key:
                raise SpecError(f"mca item {item!r} (from --opt mca=...) is not NAME=VALUE")
            extra += ["-mca", key, value]
        return extra

    def launch_lines(self, spec: JobSpec) -> list[str]:
        python = default_python(spec)
        opts = self.settings(spec)
        # PATH as the seed does, but not into a container: the image's own PATH must find its python.
        exports = [*RENDEZVOUS_VARS, *(["PATH"] if spec.container is None else []), BOOT_VAR, *job_env_names(spec)]
        if spec.stop_signal_seconds:
            exports.append("TORCHHPC_STOP_FILE")
        launcher = launcher_of(spec)
        if not launcher.per_node:
            mpi = mpirun_argv(
                str(spec.world_size),
                spec.nproc_per_node,
                export=exports,
                hostfile=Raw('"$PBS_NODEFILE"'),
                extra=[*self._mpirun_extra(opts), "--tag-output", "-x", LOG_DIR_VAR],
            )
            rank_cmd = task_argv(spec.entrypoint.argv(python), shim=TASK_REF, launcher=launcher.kind)
            # each rank's output into its own file (jobdir/logs.py), before the shim and the container
            return [join([*mpi, *log_argv(_wrap(spec, rank_cmd), launcher.rank_vars, wrapper=LOG_REF)])]
        # torchrun's workers go through the shim too: it gives them the exit cures (launchers/boot.py).
        cmd = torchrun_command(spec, python, nnodes=Raw('"$NNODES"'), rdzv_id=Raw('"$_torchhpc_jobnum"'),
                               worker_shim=TASK_REF)
        if opts["per_node"] == "mpirun":
            mpi = mpirun_argv(
                Raw('"$NNODES"'), 1, export=exports, hostfile=Raw('"$PBS_NODEFILE"'),
                extra=[*self._mpirun_extra(opts), "--tag-output"],
            )
            return [join([*mpi, *_wrap(spec, cmd)])]
        # pbsdsh starts tasks with the MOM's environment, in $HOME: carry ours explicitly.
        torque = opts["select_style"] == "torque"
        env_words = [Raw(f'{n}="${n}"') for n in exports]
        pbsdsh = ["pbsdsh", *(["-u"] if torque else []), "--", "env", "-C", Raw('"$PWD"'), *env_words]
        return [join([*pbsdsh, *_wrap(spec, cmd)])]

    def preamble_lines(self, spec: JobSpec) -> list[str]:
        return PREAMBLE.splitlines()

    def host_lines(self, spec: JobSpec) -> list[str]:
        return HOSTS.splitlines()

    def port_lines(self, spec: JobSpec) -> list[str]:
        lines = ['_torchhpc_jobnum="${PBS_JOBID%%[!0-9]*}"']
        if spec.array is not None:  # 123[4].server: every task has the number 123; make it the task's own
            lines.append("_torchhpc_jobnum=$(( 10#${_torchhpc_jobnum:-0} * 10000 + TORCHHPC_ARRAY_INDEX ))")
        return [*lines, f'MASTER_PORT="${{MASTER_PORT:-{PORT_EXPR}}}"']

    def log_lines(self, spec: JobSpec) -> list[str]:
        """mpirun's ranks write their own files (whole lines; ``--tag-output`` splices them) in
        ``<output-dir>/<name>-<job number>/ranks/``, made here: PBS copies only the ``-o`` file back,
        so the directory must be on a filesystem the nodes share, as for any job output."""
        if launcher_of(spec).per_node or spec.array is not None:
            return []
        return [
            "# Each rank's stdout and stderr go to its own file, written by the rank itself: whole lines,",
            "# whatever mpirun does with its pipes (docs/logs.md). `torchhpc logs pbs:ID --rank N`.",
            *make_ranks_dir_lines(script_path(spec, self.suffix), "$_torchhpc_jobnum"),
        ]

    def end_dir_words(self, spec: JobSpec) -> str | None:
        """The job's directory, where it has one (mpirun, not an array: :meth:`log_lines`), for its end marker."""
        if launcher_of(spec).per_node or spec.array is not None:
            return None
        from torchhpc.jobdir.endmark import quoted_dir

        return quoted_dir(os.path.splitext(script_path(spec, self.suffix))[0] + "-", "${PBS_JOBID%%[!0-9]*}")

    def schedule(self, submission: Submission) -> str:
        """qsub, then remember the job's directory (its name holds the job number) for ``logs``."""
        job_id = super().schedule(submission)
        spec = submission.spec
        if not launcher_of(spec).per_node and spec.array is None and submission.script_path:
            seq = re.match(r"\d+", job_id)
            if seq:
                update_record(self.name, job_id, job_dir=job_dir(submission.script_path, seq.group(0)),
                              output_path=self.log_paths(job_id)[0])
        return job_id

    def exported(self) -> str:
        return "MASTER_ADDR MASTER_PORT NNODES"

    def check_lines(self, spec: JobSpec) -> list[str]:
        return [
            f'if [ "$NNODES" -ne {spec.nodes} ]; then',
            f'  echo "torchhpc: expected {spec.nodes} hosts in $PBS_NODEFILE, found $NNODES" >&2',
            "fi",
        ]

    def before_step_lines(self, spec: JobSpec) -> list[str]:
        """PBS sends no warning signal before the walltime kill (SIGTERM, then SIGKILL after the
        server's kill_delay), so the script keeps its own timer, ``--signal-before`` seconds ahead
        of the walltime. Ranks see the same stop file as under Slurm."""
        wall, before = spec.time_seconds, spec.stop_signal_seconds
        if not (wall and before):
            return []
        return [f"( sleep {wall - before} && _torchhpc_stop time-limit ) &", "_torchhpc_timer=$!"]

    def after_step_lines(self, spec: JobSpec) -> list[str]:
        return ['kill "$_torchhpc_timer" 2>/dev/null || true'] if self.before_step_lines(spec) else []

    def submit_argv(self, path: str) -> tuple[str, ...]:
        return ("qsub", path)

    def parse_job_id(self, stdout: str) -> str:
        job_id = stdout.strip().splitlines()[-1].strip() if stdout.strip() else ""
        return job_id if re.match(r"^\d+(\[\d*\])?(\.\S+)?$", job_id) else ""

    def record(self, spec: JobSpec) -> dict[str, Any]:
        # PBS_O_WORKDIR is qsub's working directory: the script cd's there, as sbatch jobs start there.
        return {"name": job_name(spec.name), "output_dir": os.path.abspath(spec.output_dir)}

    def allocation_of(self, job_id: str, env: Mapping[str, str] | None = None) -> Allocation:
        from torchhpc.schedulers.pbs.allocation import PBSAllocation

        return PBSAllocation(self, job_id, env)
