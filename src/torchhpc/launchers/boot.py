"""The rank boot directory: torch's exit cures in every rank torchhpc starts, and the shell programs ranks run.

Beside ``sitecustomize.py`` the directory holds the shell programs a batch script runs by path
(``bash "$TORCHHPC_BOOT_DIR/rank.sh" ...``), so no script carries program text: ``rank.sh`` (each
rank's log file), ``task.sh`` (the per-task shim, one ``case`` per launcher), ``env.sh`` (a
container's environment patterns), ``gpus.sh`` (docker's and podman's GPUs) and ``first_end.sh`` (a failed
srun step's first rank's own exit code, for the end trap). shellcheck lints them, and ``write.sh``, the
template of the POSIX sh that writes a boot directory where no copy was made (:func:`boot_shell`).

Why: torch 2.13's gloo backend aborts a rank at interpreter exit about half the time on a loaded
machine (a ``pt_gloo_runloop`` thread takes the GIL during ``Py_FinalizeEx``), and
``destroy_process_group()`` at the end of a script can hang (the main thread holds the GIL while it
waits for that thread). ``torchhpc.dist.init()`` cures the first, but Hugging Face Trainer, Lightning
and plain scripts never call it (in the compat matrix, half of the HF Trainer jobs ended FAILED).

How: a directory holding only ``sitecustomize.py`` (src/torchhpc/boot/sitecustomize.py, stdlib only,
no eager ``import torch``) goes first on the rank's PYTHONPATH. Its finder answers for
``torch.distributed`` only (a string compare per import) and, once that module ran,

* registers an atexit handler that lets gloo's worker threads finish before Python finalizes
  (``torchhpc.dist.teardown`` uses the same code); registered early, it runs after the program's;
* wraps ``destroy_process_group`` (``torch.distributed`` and its c10d module) to let those threads
  settle first; a destroy still running after ``$TORCHHPC_DESTROY_TIMEOUT`` s (default 60; 0: no
  limit) gets faulthandler's watchdog (a C thread, no GIL): every traceback, exit status 1.

Then it runs the ``sitecustomize`` it hides (the venv's, the image's), as Python would have.
``python -I``/``-E``/``-S`` skip it as they skip any sitecustomize.

Where the directory comes from (as ddtrace-run and opentelemetry-instrument: it ships in the package):

* local ranks: the installed package's own ``torchhpc/boot`` directory;
* a batch script (Slurm, PBS) exports ``$TORCHHPC_BOOT_DIR``, resolved by the submitter at render time
  (schedulers/batch/script.py): the installed directory where the job's Python is this one, else (a
  container, ``--python``) a copy in the output directory, written at submit. The task shim puts it
  first on PYTHONPATH: ``TORCHHPC_*`` crosses into every container runtime, the host's PYTHONPATH must
  not. A script run by hand whose directory is missing stops with one line (its programs are there);
* a pod or a container of the local scheduler: the shell writes it (:func:`boot_shell`) to
  ``${TMPDIR:-/tmp}/torchhpc-boot-UID-HASH``, mode 700, used only if the rank's user owns it (no one
  else can plant code there), renamed into place (ranks race), named by its content's hash.

``TORCHHPC_EXIT_CURE=0`` turns it off: the directory is not put on PYTHONPATH, and the file does
nothing but chain where it still is.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from torchhpc.core.shell import Raw
from torchhpc.core.units import is_off

__all__ = [
    "BOOT_DIR",
    "BOOT_VAR",
    "SHELL_PROGRAMS",
    "SHIM_LAUNCHERS",
    "SWITCH",
    "TASK_REF",
    "TASK_SH",
    "WRITER",
    "boot_argv",
    "boot_files",
    "boot_hash",
    "boot_pythonpath",
    "boot_ref",
    "boot_shell",
    "boot_source",
    "cure_enabled",
    "is_boot_copy",
    "task_argv",
]

# The directory that holds the boot sitecustomize.py in the installed package.
BOOT_DIR = str(Path(__file__).resolve().parent.parent / "boot")
SWITCH = "TORCHHPC_EXIT_CURE"
# The batch script's boot directory: task.sh puts it first on PYTHONPATH.
BOOT_VAR = "TORCHHPC_BOOT_DIR"
# The shell programs beside it (src/torchhpc/boot/*.sh), run by path; they travel with every copy.
SHELL_PROGRAMS = ("rank.sh", "task.sh", "env.sh", "gpus.sh", "first_end.sh", "end.sh", "standby.sh")
# The heredoc's end word: the boot file must never contain it as a line.
EOF_WORD = "TORCHHPC_BOOT_PY"
# The boot writer (boot/write.sh): a template boot_shell fills in; it makes a copy, and travels with none.
WRITER = "write.sh"


@functools.lru_cache(maxsize=1)
def boot_source() -> str:
    """The text of the boot ``sitecustomize.py``."""
    text = Path(BOOT_DIR, "sitecustomize.py").read_text()
    if any(line.strip() == EOF_WORD for line in text.splitlines()):
        raise AssertionError(f"the boot file contains the line {EOF_WORD}, which ends its heredoc")
    return text


@functools.lru_cache(maxsize=1)
def boot_files() -> tuple[tuple[str, str], ...]:
    """(name, text) of every file a copy of the boot directory holds: the sitecustomize and the shell programs."""
    return (("sitecustomize.py", boot_source()), *((n, Path(BOOT_DIR, n).read_text()) for n in SHELL_PROGRAMS))


def is_boot_copy(path: str, content: str) -> bool:
    """Whether ``path`` is a file of a boot copy (``.torchhpc-boot-HASH/NAME``) with the package's own text."""
    if not os.path.basename(os.path.dirname(path)).startswith((".torchhpc-boot-", "torchhpc-boot-")):
        return False
    return dict(boot_files()).get(os.path.basename(path)) == content


def boot_hash() -> str:
    """The content's name of a boot copy: every file of it (a new shell program is a new copy)."""
    import hashlib  # here: only a job that writes a boot copy (a container, --python) names one

    h = hashlib.sha256()
    for name, text in boot_files():
        h.update(f"{name}\0{text}\0".encode())
    return h.hexdigest()[:12]


def boot_ref(name: str) -> Raw:
    """A batch script's word for a file of its boot directory: ``"$TORCHHPC_BOOT_DIR/NAME"``."""
    return Raw(f'"${BOOT_VAR}/{name}"')


def cure_enabled(env: Mapping[str, str]) -> bool:
    """False when ``TORCHHPC_EXIT_CURE`` says off (0, false, no, off)."""
    return not is_off(env.get(SWITCH, "1"))


def boot_pythonpath(env: Mapping[str, str]) -> str | None:
    """PYTHONPATH for a rank on this machine: the package's boot directory first; None when switched off."""
    if not cure_enabled(env):
        return None
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != BOOT_DIR]
    return os.pathsep.join([BOOT_DIR, *rest])


def boot_shell() -> str:
    """POSIX sh lines that write the boot directory (once per node and version) and put it first on PYTHONPATH.

    The program is ``boot/write.sh`` (shellcheck lints it), less its leading comment lines, with its
    placeholders filled in: the line ``@SITECUSTOMIZE_PY@`` becomes the boot ``sitecustomize.py`` (the
    body of a quoted heredoc ended by :data:`EOF_WORD`), ``@BOOT_HASH@`` the copy's :func:`boot_hash`.
    Safe under ``set -e``: a directory that cannot be made or is not the user's costs the cure
    (one line on stderr), never the rank.
    """
    src = boot_source()
    if not src.endswith("\n"):
        src += "\n"
    lines = Path(BOOT_DIR, WRITER).read_text().splitlines(keepends=True)
    while lines and lines[0].startswith("#"):  # the file's own comments and shellcheck's directive
        lines.pop(0)
    program = "".join(lines)
    if f"<<\\{EOF_WORD}\n@SITECUSTOMIZE_PY@\n{EOF_WORD}\n" not in program or f'"${{{SWITCH}:-1}}"' not in program:
        raise AssertionError(f"boot/{WRITER} lost its heredoc of sitecustomize.py or its {SWITCH} switch")
    return program.replace("@BOOT_HASH@", boot_hash()).replace("@SITECUSTOMIZE_PY@\n", src)


def boot_argv(argv: Sequence[str]) -> list[str]:
    """``sh -c BOOT; exec "$@"`` around ``argv``: for a rank that no shim starts (a container of the local scheduler)."""
    return ["sh", "-c", boot_shell() + 'exec "$@"', "torchhpc-boot", *argv]


# --- the per-task shim: boot/task.sh ------------------------------------------------------------------------
# srun-direct and mpirun start one process per rank but export only their own variables (SLURM_PROCID,
# OMPI_COMM_WORLD_RANK, PMI_RANK); an unmodified script that calls init_process_group() needs torch's env://
# contract. The shim maps the launcher's variables, then execs the command (signals reach it directly). Every
# rank/world variable a known detector reads (Lightning, submitit, idr_torch, is_torchelastic_launched(),
# scripts written for Slurm or Open MPI) describes this process or is absent: a launcher step's SLURM_* are
# rewritten to the rank's, foreign OMPI_*/PMI_*/MV2_* and TORCHELASTIC_* unset; job-level Slurm identity is
# never touched (srun, scontrol and the requeue keep working). docs/compat.md has the table, variable x launcher.

# The launchers the shim knows by name (its first argument; "auto" guesses: MPI first, then Slurm).
SHIM_LAUNCHERS = ("srun", "mpirun", "torchrun")
# The shim in the installed package, and a batch script's word for it (its boot directory's copy).
TASK_SH = os.path.join(BOOT_DIR, "task.sh")
TASK_REF = boot_ref("task.sh")


def task_argv(command: Sequence[str], shim: str = TASK_SH, launcher: str | None = None) -> list[str]:
    """Wrap one rank's command in the shim: ``bash SHIM LAUNCHER CMD...``.

    ``shim=TASK_REF`` in a batch script (``"$TORCHHPC_BOOT_DIR/task.sh"``). Name the ``launcher`` so stale
    variables of another launcher can never win; None guesses (``auto``).
    """
    if launcher is not None and launcher not in SHIM_LAUNCHERS:
        raise ValueError(f"unknown launcher {launcher!r} for the task shim (one of {', '.join(SHIM_LAUNCHERS)})")
    return ["bash", shim, launcher or "auto", *command]
