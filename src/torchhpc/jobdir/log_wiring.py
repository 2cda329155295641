"""How each rank's output gets its own file: the script side of :mod:`torchhpc.jobdir.logs`.

The batch scripts export ``$TORCHHPC_RANKS_DIR`` and run every rank's command through
:data:`LOG_WRAPPER`; :mod:`torchhpc.jobdir.logs` reads the files back. Shell text is
built with :mod:`torchhpc.core.shell` (the one quoting rule).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from torchhpc.core.shell import Raw
from torchhpc.launchers import TORCHRUN

__all__ = [
    "LOG_DIR_VAR",
    "LOG_REF",
    "LOG_VAR",
    "LOG_WRAPPER",
    "RANKS_DIR",
    "job_dir",
    "log_argv",
    "make_ranks_dir_lines",
    "ranks_dir_ref",
    "torchrun_per_rank",
]

RANKS_DIR = "ranks"

# Runs each rank's program with its stdout and stderr appended to its own file in
# $TORCHHPC_RANKS_DIR (exported by the batch script; not an argument, so no job name or path
# is in the launch command), then execs it: signals reach the program directly. The rank
# comes from the first set variable of a list the launcher decides (Launcher.rank_vars): srun and
# mpirun run the wrapper before the task shim and outside any container, torchrun around each
# worker. PYTHONUNBUFFERED (only defaulted): a file is block-buffered otherwise and `logs -f`
# would see lines minutes late. Without the directory (a script submitted by hand, where
# torchhpc did not create it) the output stays on the launcher's stream, labelled there as
# before; a directory that exists but cannot be written is said once per rank. The node is the
# kernel's host name: $HOSTNAME is inherited from the batch shell (Slurm sets it there).
LOG_DIR_VAR = "TORCHHPC_RANKS_DIR"
LOG_WRAPPER = r"""_torchhpc_rank=0; for _torchhpc_v in $1; do [ -z "${!_torchhpc_v:-}" ] || { _torchhpc_rank=${!_torchhpc_v}; break; }; done; shift
if [ -d "${TORCHHPC_RANKS_DIR:-}" ]; then
  read -r _torchhpc_host </proc/sys/kernel/hostname 2>/dev/null || _torchhpc_host=${SLURMD_NODENAME:-${HOSTNAME:-}}
  _torchhpc_log="$TORCHHPC_RANKS_DIR/rank-$_torchhpc_rank@${_torchhpc_host%%.*}.log"
  if : >>"$_torchhpc_log" 2>/dev/null; then exec >>"$_torchhpc_log" 2>&1
  else echo "torchhpc: cannot write $_torchhpc_log; rank $_torchhpc_rank's output stays here" >&2; fi
fi
unset _torchhpc_rank _torchhpc_v _torchhpc_host _torchhpc_log; : "${PYTHONUNBUFFERED:=1}"; export PYTHONUNBUFFERED
exec "$@"
"""

# Where the wrapper reads the rank, per launcher (first set wins; the task shim's order for MPI).


# Batch scripts define the wrapper once, in their generated helpers, under this name (reserved prefix:
# no --env can change it) and pass "$_torchhpc_rank_log", so the launch line carries no program text.
LOG_VAR = "_torchhpc_rank_log"
LOG_REF = Raw(f'"${LOG_VAR}"')


def log_argv(command: Sequence[str], rank_vars: str = "RANK", wrapper: str = LOG_WRAPPER) -> list[str]:
    """``bash -c LOG_WRAPPER torchhpc-log VARS CMD...``: CMD's output into ``$TORCHHPC_RANKS_DIR/rank-N@NODE.log``.

    ``wrapper=LOG_REF`` in a batch script, which defines the text once (:data:`LOG_VAR`)."""
    return ["bash", "-c", wrapper, "torchhpc-log", rank_vars, *command]


def job_dir(script_path: str, job_id: str) -> str:
    """``<output-dir>/<name>-<id>``: the job's directory, beside where its script was rendered."""
    return f"{os.path.splitext(script_path)[0]}-{job_id}"


def ranks_dir_ref(script_path: str, job_id_ref: str) -> str:
    """The shell words for ``<job dir>/ranks`` inside the script (the id expands at run time)."""
    from torchhpc.core.shell import quote

    return f'{quote(os.path.splitext(script_path)[0] + "-")}"{job_id_ref}"/{RANKS_DIR}'


def make_ranks_dir_lines(script_path: str, job_id_ref: str) -> list[str]:
    """Script lines that export ``$TORCHHPC_RANKS_DIR`` and make it at run time.

    For jobs whose directory the submitter cannot make beforehand (a Slurm array task's
    id, a PBS job number known only once the job runs): the batch shell makes its own.
    If it cannot, the ranks' output stays on the launcher's stream, with a warning."""
    return [
        f"export {LOG_DIR_VAR}={ranks_dir_ref(script_path, job_id_ref)}",
        f'if mkdir -p -- "${LOG_DIR_VAR}" 2>/dev/null; then echo "torchhpc: rank output in ${LOG_DIR_VAR}"',
        f'else echo "torchhpc: cannot create ${LOG_DIR_VAR}; rank output stays here" >&2; fi',
    ]


def torchrun_per_rank(torchrun: Sequence[str]) -> list[str]:
    """torchrun's argv with each worker run through :data:`LOG_WRAPPER`.

    The workers must already be a command (``--no-python ...``, the task shim):
    the wrapper goes right after ``--no-python``. ``--tee`` goes: the workers'
    output is in their files, not on torchrun's pipe.
    """
    head = list(torchrun)
    if "--tee" in head:
        i = head.index("--tee")
        del head[i : i + 2]
    i = head.index("--no-python") + 1
    return [*head[:i], *log_argv(head[i:], TORCHRUN.rank_vars, wrapper=LOG_REF)]
