"""The stop protocol in the batch shell (docs/nothing-lost.md): the stop file, the traps that touch it, the wait.

Apart from :mod:`~torchhpc.schedulers.batch.base`, which lays out the whole script: these are the helpers
``main()`` calls when the job may be told to stop (a time-limit warning, a preemption, ``--requeue``), the same
for every batch backend; a backend supplies only its job id's variable, its signals and the lines around the step.

Why a file and not a signal: torchrun's agent, mpirun, container runtimes and NCCL each handle signals their
own way; every rank sees a file in the output directory the same way, and polls it with
``torchhpc.dist.should_stop()`` (one small all_reduce: all stop at the same step).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from torchhpc.core.shell import quote
from torchhpc.core.spec import JobSpec

__all__ = ["WAIT_LINES", "indent", "stop_file", "stop_helper_lines"]

# The step runs in the background (bash defers traps until a foreground command ends). A trap cuts `wait`
# short with 128+signal; bash keeps a reaped child's status, so we wait again: the step's own status. (`while
# kill -0` lost the status of a step that ended between trap and test: exit 140 after a clean checkpoint.)
WAIT_COMMENT = (
    "# Wait for the step (in the background, so traps fire while it runs); a trap cuts `wait` short with",
    "# 128+signal while the step runs on: wait again for the step's own status.",
)
WAIT_LINES = (
    "_torchhpc_step=$!",
    "_torchhpc_rc=0 _torchhpc_woken=0",
    'wait "$_torchhpc_step" || _torchhpc_rc=$?',
    'while [ "$_torchhpc_woken" = 1 ] && [ "$_torchhpc_rc" -gt 128 ]; do',
    "  _torchhpc_rc=0 _torchhpc_woken=0",
    '  wait "$_torchhpc_step" || _torchhpc_rc=$?',
    "done",
)


def indent(lines: list[str], by: str = "  ") -> list[str]:
    """Lines inside a shell function's body (blank lines stay blank)."""
    return [by + line if line else line for line in lines]


def stop_file(spec: JobSpec) -> str:
    """The stop file's path without the job id (the script appends it)."""
    return os.path.join(os.path.abspath(spec.output_dir), ".torchhpc-stop-")


def stop_helper_lines(
    spec: JobSpec,
    job_id_ref: str,
    arm_lines: Sequence[str],
    traps: Sequence[tuple[str, str]],
    words: Mapping[str, str],
    after_step: Sequence[str],
) -> list[str]:
    """Time limit and preemption: the stop file, the traps (``_torchhpc_arm_stop``), and the wait
    for the step in the background with what follows it (``_torchhpc_wait_step``).

    ``job_id_ref`` is the job id as the batch shell sees it (the stop file's name); ``arm_lines`` the
    backend's exports and timers before the traps; ``traps`` its (reason, signal) pairs, each said in
    ``words`` where the reason's own word is jargon; ``after_step`` what follows the step (a requeue).
    """
    return [
        "# The stop protocol (docs/nothing-lost.md): a stop file every rank polls with torchhpc.dist.should_stop().",
        '_torchhpc_stop_reason="" _torchhpc_woken=0',
        "_torchhpc_stop() {",
        "  _torchhpc_stop_reason=$1 _torchhpc_woken=1",
        '  echo "torchhpc: ${2:-$1} at $(date +%T): asking every rank to checkpoint and stop"',
        '  touch -- "$TORCHHPC_STOP_FILE"',
        "}",
        "_torchhpc_arm_stop() {",
        *indent([
            f'export TORCHHPC_STOP_FILE={quote(stop_file(spec))}"{job_id_ref}"',
            'rm -f -- "$TORCHHPC_STOP_FILE" "$TORCHHPC_STOP_FILE.taken"',
            *arm_lines,
            *(f"trap '_torchhpc_stop {reason}{said}' {sig}" for reason, sig in traps
              for said in [f' "{words[reason]}"' if reason in words else ""]),
        ]),
        "}",
        *WAIT_COMMENT,
        "_torchhpc_wait_step() {",
        *indent([*WAIT_LINES, *after_step]),
        "}",
    ]
