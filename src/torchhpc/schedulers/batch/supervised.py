"""The launch under the in-allocation supervisor (docs/resilience.md), for every batch backend.

Apart from :mod:`~torchhpc.schedulers.batch.base`, which runs the launch itself when no supervisor is asked
for: with spare nodes or restarts (``--spares``, ``--max-restarts``) the launch becomes the bash function
``_torchhpc_step``, and the script runs :mod:`torchhpc.supervisor` instead, which starts it on N healthy
nodes per attempt and restarts it by policy. The supervisor's flags are written here, from the spec.
"""

from __future__ import annotations

import sys

from torchhpc.core.shell import Raw, join, split_words, wrap_command
from torchhpc.core.spec import JobSpec, default_python
from torchhpc.schedulers.batch.step import launch_breaks

__all__ = ["supervised_lines"]


def supervised_lines(spec: JobSpec, launch: list[str], stopping: bool) -> list[str]:
    """The launch as the bash function ``_torchhpc_step``, run by the in-allocation supervisor
    (:mod:`torchhpc.supervisor`) on N healthy nodes per attempt, restarted by policy; in the background
    (``&``) when ``stopping``: the stop protocol waits for it."""
    shrink = f", at least {spec.min_nodes} when no spare is left (--min-nodes)" if spec.shrinks else ""
    lines = [
        f"# Under the in-allocation supervisor (docs/resilience.md): {spec.nodes} of the allocation's "
        f"{spec.nodes + spec.spares} nodes per attempt{shrink};",
        "# it checks the step's nodes every 2 s and restarts after a node failure, hang or network error.",
        "_torchhpc_step() {",
    ]
    if spec.on_restart_append and launch:  # the program's arguments end the launch: the supervisor's go after
        launch = [*launch[:-1], launch[-1] + ' "$@"']
    lines += ["  " + x[2:] for line in launch for x in wrap_command(line, launch_breaks(line, spec))]
    lines += ["}", "export -f _torchhpc_step"]
    python = sys.executable if spec.container is not None else default_python(spec)
    argv = [python, "-m", "torchhpc.supervisor", "--job-dir", Raw('"${TORCHHPC_RANKS_DIR%/ranks}"'),
            "--nodes", str(spec.nodes), "--nproc-per-node", str(spec.nproc_per_node),
            "--launcher", str(spec.launcher), "--max-restarts", str(spec.max_restarts)]
    if spec.shrinks:
        argv += ["--min-nodes", str(spec.min_nodes)]
    if spec.hang_timeout:
        argv += ["--hang-timeout", f"{spec.hang_timeout:g}"]
    if spec.requeue:
        argv.append("--requeue")
    if spec.max_no_progress != 3:
        argv += ["--max-no-progress", str(spec.max_no_progress)]
    if spec.checkpoint_dir:
        argv += ["--checkpoint-dir", spec.checkpoint_dir]
    if spec.on_restart_append:
        argv += ["--on-restart-append", spec.on_restart_append]
    if warm_restarts(spec):
        argv.append("--warm")
    line = join(argv)
    wrapped = [x[2:] for x in wrap_command(line, [split_words(line).index("--nodes")])]
    wrapped[-1] += " &" if stopping else ""
    return [*lines, *wrapped]


def warm_restarts(spec: JobSpec) -> bool:
    """Whether restarts can start from a standby interpreter (supervisor/standby.py): each rank is a process of
    this Python (srun's and mpirun's tasks, torchrun's agent and workers), running a script or a module, outside a
    container."""
    return spec.container is None and spec.entrypoint.kind in ("script", "module")
