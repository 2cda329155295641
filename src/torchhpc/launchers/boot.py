"""The rank boot directory: torch's exit cures in every rank torchhpc starts, without an import.

Why: torch 2.13's gloo backend aborts a rank at interpreter exit about half the time on a
loaded machine (a ``pt_gloo_runloop`` thread takes the GIL during ``Py_FinalizeEx``), and
``destroy_process_group()`` at the end of a script can hang (the main thread holds the GIL
while it waits for that thread). ``torchhpc.dist.init()`` cures the first, but Hugging Face
Trainer, Lightning and plain scripts never call it (in the compat matrix, half of the HF Trainer jobs
ended FAILED after training was done).

How: a directory holding only ``sitecustomize.py`` (src/torchhpc/boot/sitecustomize.py,
stdlib only, no eager ``import torch``) goes first on the rank's PYTHONPATH. Python imports
it at start-up; it puts a finder first on ``sys.meta_path`` that answers for
``torch.distributed`` only (a string compare per import, nothing when torch is never
imported) and, once that module ran,

* registers an atexit handler that lets gloo's worker threads finish before Python
  finalizes (the cure of ``torchhpc.dist.teardown``, copied: the file must run where
  torchhpc is not installed); registered early, it runs after the program's own handlers;
* wraps ``destroy_process_group`` (in ``torch.distributed`` and its c10d module) so that it
  first lets those threads settle: a thread still destroying its last work wants the GIL
  that the destroying main thread holds, a hang until the time limit. If the destroy has
  still not returned after ``$TORCHHPC_DESTROY_TIMEOUT`` seconds (default 60; 0: no
  limit), faulthandler's watchdog (a C thread: it needs no GIL) prints every thread's
  traceback and exits the rank with status 1, so the job fails instead of hanging.

Then it runs the ``sitecustomize`` it hides (the venv's, conda's, the image's: the next one
on sys.path), as Python would have. A program that is not Python ignores PYTHONPATH;
``python -I``/``-E``/``-S`` skip it as they skip any sitecustomize.

Where the directory comes from:

* local ranks on this machine: the installed package's own ``torchhpc/boot`` directory;
* everywhere else (the per-task shim, a container of the local scheduler, a pod), the
  rank's shell writes it itself: ``${TMPDIR:-/tmp}/torchhpc-boot-UID-HASH``, created mode
  700 and used only if owned by the rank's user (no other user can plant code there), the
  file written to a temporary name and renamed (ranks of a node race), named by a hash of
  its content (an upgrade never runs an old copy). No bind mount, no shared filesystem,
  nothing that must be installed in an image: the few lines travel in the script.

``TORCHHPC_EXIT_CURE=0`` (e.g. ``--env TORCHHPC_EXIT_CURE=0``) turns it off: the directory
is not put on PYTHONPATH, and the file does nothing but chain where it still is.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = [
    "BOOT_DIR",
    "SWITCH",
    "boot_argv",
    "boot_pythonpath",
    "boot_shell",
    "boot_source",
    "cure_enabled",
]

# The directory that holds the boot sitecustomize.py in the installed package.
BOOT_DIR = str(Path(__file__).resolve().parent.parent / "boot")
SWITCH = "TORCHHPC_EXIT_CURE"
OFF = ("0", "false", "no", "off")
# The heredoc's end word: the boot file must never contain it as a line.
EOF_WORD = "TORCHHPC_BOOT_PY"


@functools.lru_cache(maxsize=1)
def boot_source() -> str:
    """The text of the boot ``sitecustomize.py``."""
    text = Path(BOOT_DIR, "sitecustomize.py").read_text()
    if any(line.strip() == EOF_WORD for line in text.splitlines()):
        raise AssertionError(f"the boot file contains the line {EOF_WORD}, which ends its heredoc")
    return text


def boot_hash() -> str:
    return hashlib.sha256(boot_source().encode()).hexdigest()[:12]


def cure_enabled(env: Mapping[str, str]) -> bool:
    """False when ``TORCHHPC_EXIT_CURE`` says off (0, false, no, off)."""
    return env.get(SWITCH, "1").strip().lower() not in OFF


def boot_pythonpath(env: Mapping[str, str]) -> str | None:
    """PYTHONPATH for a rank on this machine: the package's boot directory first; None when switched off."""
    if not cure_enabled(env):
        return None
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != BOOT_DIR]
    return os.pathsep.join([BOOT_DIR, *rest])


def boot_shell() -> str:
    """POSIX sh lines that write the boot directory (once per node and version) and put it first on PYTHONPATH.

    Safe under ``set -e``: a directory that cannot be made or is not the user's costs the cure
    (one line on stderr), never the rank.
    """
    src = boot_source()
    if not src.endswith("\n"):
        src += "\n"
    return (
        f'if [ "${{{SWITCH}:-1}}" != 0 ]; then\n'
        '  _torchhpc_b=${TMPDIR:-/tmp}; { [ -d "$_torchhpc_b" ] && [ -w "$_torchhpc_b" ]; } || _torchhpc_b=/tmp\n'
        f'  _torchhpc_b=$_torchhpc_b/torchhpc-boot-${{UID:-$(id -u)}}-{boot_hash()}\n'
        '  if [ ! -f "$_torchhpc_b/sitecustomize.py" ]; then\n'
        '    mkdir -m 700 "$_torchhpc_b" 2>/dev/null || :\n'
        '    if [ -O "$_torchhpc_b" ] && [ ! -L "$_torchhpc_b" ]; then\n'
        f'      {{ cat > "$_torchhpc_b/.sitecustomize.$$" <<\\{EOF_WORD}\n'
        f"{src}{EOF_WORD}\n"
        '      } 2>/dev/null && mv -f "$_torchhpc_b/.sitecustomize.$$" "$_torchhpc_b/sitecustomize.py" 2>/dev/null || :\n'
        "    fi\n"
        "  fi\n"
        '  if [ -O "$_torchhpc_b" ] && [ ! -L "$_torchhpc_b" ] && [ -f "$_torchhpc_b/sitecustomize.py" ]; then\n'
        '    export PYTHONPATH="$_torchhpc_b${PYTHONPATH:+:$PYTHONPATH}"\n'
        "  else\n"
        '    echo "torchhpc: no exit cure in this rank: cannot write $_torchhpc_b as this user" >&2\n'
        "  fi\n"
        "fi\n"
    )


def boot_argv(argv: Sequence[str]) -> list[str]:
    """``sh -c BOOT; exec "$@"`` around ``argv``: for a rank that no shim starts (a container of the local scheduler)."""
    return ["sh", "-c", boot_shell() + 'exec "$@"', "torchhpc-boot", *argv]
