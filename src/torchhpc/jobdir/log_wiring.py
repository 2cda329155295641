"""How each rank's output gets its own file: the script side of :mod:`torchhpc.jobdir.logs`.

The batch scripts export ``$TORCHHPC_RANKS_DIR`` and run every rank's command through
:data:`LOG_WRAPPER` (boot/rank.sh); :mod:`torchhpc.jobdir.logs` reads the files back. Shell text is
built with :mod:`torchhpc.core.shell` (the one quoting rule).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from torchhpc.jobdir.layout import RANKS_DIR
from torchhpc.launchers import TORCHRUN
from torchhpc.launchers.boot import BOOT_DIR, boot_ref

__all__ = [
    "LOG_DIR_VAR",
    "LOG_REF",
    "LOG_WRAPPER",
    "RANKS_DIR",
    "job_dir",
    "log_argv",
    "make_ranks_dir_lines",
    "ranks_dir_ref",
    "torchrun_per_rank",
]


# Each rank's program runs through src/torchhpc/boot/rank.sh (the comments there say how): its output
# appended to its own file in $TORCHHPC_RANKS_DIR (exported by the batch script; not an argument, so
# no job name or path is in the launch command), then exec. The rank comes from the first set variable
# of a list the launcher decides (Launcher.rank_vars): srun and mpirun run the wrapper before the task
# shim and outside any container, torchrun around each worker.
LOG_DIR_VAR = "TORCHHPC_RANKS_DIR"
# The wrapper in the installed package, and a batch script's word for it (its boot directory's copy).
LOG_WRAPPER = os.path.join(BOOT_DIR, "rank.sh")
LOG_REF = boot_ref("rank.sh")


def log_argv(command: Sequence[str], rank_vars: str = "RANK", wrapper: str = LOG_WRAPPER) -> list[str]:
    """``bash rank.sh VARS CMD...``: CMD's output into ``$TORCHHPC_RANKS_DIR/rank-N@NODE.log``.

    ``wrapper=LOG_REF`` in a batch script (``"$TORCHHPC_BOOT_DIR/rank.sh"``)."""
    return ["bash", wrapper, rank_vars, *command]


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
