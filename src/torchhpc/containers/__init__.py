"""Run a command inside a container: argv in, argv out, one container per task.

``wrap(container, argv)`` returns the command that runs ``argv`` in ``container`` with
the container runtime named by ``container.runtime``; ``srun_options`` gives the srun
flags that describe the container instead (pyxis); ``setup_lines`` the shell lines a
batch script runs first (enroot import/create). Runtime modules load on first use.

The launcher runs *inside* the container (its per-task shim computes ranks from
``SLURM_*`` there), so ``pass_env`` names what must reach it: exact names and
prefixes ending in ``*`` (``SLURM_*``, ``PMIX_*``, ``OMPI_*``).

Runtime options (``ContainerSpec.options``) are listed by :func:`runtime_options`; an
unknown one is an error that lists them. Every runtime takes ``binary`` (or
``$TORCHHPC_<RUNTIME>_BINARY``) for a site wrapper such as the MareNostrum5 guide's ``bsc_singularity``.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from types import ModuleType

from torchhpc.containers._common import COMMON_OPTIONS, Wrapping, binary
from torchhpc.core.spec import RUNTIMES, ContainerSpec
from torchhpc.errors import SpecError

__all__ = [
    "MODULES",
    "check_runtime_here",
    "per_node_lines",
    "runtime_options",
    "sbatch_directives",
    "setup_lines",
    "srun_options",
    "wrap",
]

# runtime -> module implementing it (apptainer and singularity share one, as do docker and podman)
MODULES: dict[str, str] = {
    "apptainer": "apptainer",
    "singularity": "apptainer",
    "pyxis": "pyxis",
    "enroot": "enroot",
    "docker": "docker",
    "podman": "docker",
    "charliecloud": "charliecloud",
}


def _module(runtime: str) -> ModuleType:
    if runtime not in MODULES:
        raise SpecError(f"--runtime {runtime!r} is not a container runtime", f"choose one of: {', '.join(RUNTIMES)}")
    return importlib.import_module(f"torchhpc.containers.{MODULES[runtime]}")


def _lines(container: ContainerSpec, hook: str) -> list[str]:
    """The runtime module's ``hook(container)``; ``[]`` where the runtime has none."""
    return list(getattr(_module(container.runtime), hook, lambda _c: [])(container))


def wrap(
    container: ContainerSpec,
    argv: list[str],
    *,
    gpus: int = 0,
    gpu_kind: str = "nvidia",
    pass_env: Sequence[str] = (),
    interactive: bool = False,
    boot_var: str = "",
) -> list[str]:
    """The argv that runs ``argv`` inside ``container`` (unchanged for pyxis: see :func:`srun_options`).

    ``gpus`` > 0 asks for the node's GPUs of ``gpu_kind`` ("nvidia" or "amd"); ``pass_env``
    lists variable names and ``PREFIX*`` patterns that must reach the process inside;
    ``interactive`` asks for a terminal (``torchhpc shell``: docker/podman ``-it``); ``boot_var``
    names the variable that holds the boot directory in a script (else the installed one's path).
    """
    how = Wrapping(gpus=gpus, gpu_kind=gpu_kind, pass_env=tuple(pass_env), interactive=interactive, boot_var=boot_var)
    return list(_module(container.runtime).wrap(container, list(argv), how))


def srun_options(container: ContainerSpec) -> list[str]:
    """srun flags that put each task in the container (pyxis); ``[]`` for other runtimes."""
    return _lines(container, "srun_options")


def sbatch_directives(container: ContainerSpec) -> list[str]:
    """``#SBATCH`` lines for pyxis (``#`` escaped); ``[]`` for other runtimes."""
    return _lines(container, "sbatch_directives")


def setup_lines(container: ContainerSpec) -> list[str]:
    """Shell lines a batch script runs before any task (enroot import/create); often ``[]``.

    ``module load singularity`` and the like are site profile settings, not returned here.
    """
    return _lines(container, "setup_lines")


def per_node_lines(container: ContainerSpec) -> list[str]:
    """Those of :func:`setup_lines` that every node must run once (enroot create), as one shell line each."""
    return _lines(container, "per_node_lines")


# the executable each runtime runs (``binary`` / $TORCHHPC_<RUNTIME>_BINARY may name a site wrapper instead)
_EXECUTABLE = {"charliecloud": "ch-run", "pyxis": "srun"}


def check_runtime_here(container: ContainerSpec) -> None:
    """Refuse, before any rank starts, a runtime whose executable is not on this machine's PATH: one line,
    with the runtimes that are, instead of every rank's 'command not found' around the whole boot command."""
    import shutil

    exe = binary(container, dict(container.options), _EXECUTABLE.get(container.runtime, container.runtime))
    if shutil.which(exe):
        return
    here = [r for r in RUNTIMES if r != "pyxis" and shutil.which(_EXECUTABLE.get(r, r))]
    raise SpecError(
        f"--runtime {container.runtime}: `{exe}` is not on PATH here, so no rank could start",
        (f"runtimes on PATH here: {', '.join(here)} (--runtime NAME)" if here else "no container runtime is installed here")
        + "; --no-container runs on the host's python; `torchhpc doctor` checks them",
    )


def runtime_options(runtime: str) -> dict[str, str]:
    """The options ``runtime`` understands, name -> description (for ``torchhpc options``)."""
    return {**COMMON_OPTIONS, **_module(runtime).OPTIONS}
