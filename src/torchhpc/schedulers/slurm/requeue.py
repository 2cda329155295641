"""What the Slurm batch shell does after a stop (time-limit warning, preemption): requeue, or end with the stop's class.

Its own module beside the renderer (slurm/slurm.py) because it is the one part of the script with a
decision in it: requeue the job, leave it to Slurm, or end it. A job whose ranks took the stop ended
its step 0 with its work unfinished; ended there (no requeue asked, or ``--max-requeues`` used up) it
must not read as done (issue 70: ``COMPLETED 0`` let ``--after-ok`` and pipelines go on): it ends with
the stop's class, 85 time-limit or 86 preempted (core/exitcodes.py, README's table).
"""

from __future__ import annotations

from torchhpc.core.exitcodes import exit_code_for
from torchhpc.core.spec import JobSpec

__all__ = ["after_stop_lines", "unfinished_lines"]


def unfinished_lines() -> list[str]:
    """A step that ended 0 after its ranks took the stop (``should_stop()`` wrote ``$TORCHHPC_STOP_FILE.taken``)
    and a job not requeued: the ranks stopped short of their work, so the job ends with the stop's class."""
    limit, preempted = exit_code_for("time-limit"), exit_code_for("preempted")
    return [
        "# Stopped short and not requeued: the work is unfinished, the job ends with the stop's class (README).",
        'if [ "$_torchhpc_rc" = 0 ] && [ "${_torchhpc_end_state:-}" != REQUEUED ] && [ -e "$TORCHHPC_STOP_FILE.taken" ]; then',
        '  case $_torchhpc_stop_reason in',
        f"    time-limit) _torchhpc_rc={limit} ;;",
        f"    preempted) _torchhpc_rc={preempted} ;;",
        "  esac",
        '  if [ "$_torchhpc_rc" != 0 ]; then',
        '    echo "torchhpc: the ranks stopped at the $_torchhpc_stop_reason and the job is not requeued: its work is'
        ' unfinished (exit $_torchhpc_rc, $_torchhpc_stop_reason)"',
        "  fi",
        "fi",
    ]


def after_stop_lines(spec: JobSpec) -> list[str]:
    """After a time-limit warning or a preemption (a rank created the stop file) the batch
    shell, on the host (``scontrol`` is rarely inside containers), requeues the job whatever
    the step's exit status: torchrun exits 1 after a SIGTERM even when its workers
    checkpointed and left cleanly. It requeues only a job that is still RUNNING (never one
    being cancelled). Time-limit requeues are capped (a counter file in the output
    directory); preemptions are not. A step that ends 0 after a time-limit warning that no
    rank took (``should_stop()`` writes ``$TORCHHPC_STOP_FILE.taken``) had done its work before
    the warning reached it: requeued, it would do its last steps again.
    """
    lines = [
        "# A rank that got SIGTERM without the batch shell getting one: preemption's grace time.",
        'if [ -z "$_torchhpc_stop_reason" ] && [ -e "$TORCHHPC_STOP_FILE" ]; then _torchhpc_stop_reason=preempted; fi',
    ]
    if not spec.requeue:
        return [*lines, *unfinished_lines()]
    cap = int(spec.max_timeout_requeues)
    return [
        *lines,
        'if [ "$_torchhpc_stop_reason" = ended-by-slurm ]; then',
        '  echo "torchhpc: Slurm is ending this job (scancel, time limit or its own requeue): not requeuing from here"',
        'elif [ "$_torchhpc_stop_reason" = time-limit ] && [ "$_torchhpc_rc" = 0 ] && [ ! -e "$TORCHHPC_STOP_FILE.taken" ]; then',
        '  echo "torchhpc: the step ended 0 before any rank took the time-limit stop (its work was done): not requeuing"',
        'elif [ -n "$_torchhpc_stop_reason" ]; then',
        '  _torchhpc_n=$(cat -- "$_torchhpc_timeouts_file" 2>/dev/null || echo 0)',
        '  _torchhpc_state=$(scontrol show job -o "$SLURM_JOB_ID" 2>/dev/null | grep -o "JobState=[A-Z_]*" || true)',
        '  if [ "$_torchhpc_state" != JobState=RUNNING ]; then',
        '    echo "torchhpc: not requeuing: ${_torchhpc_state:-the job state is unknown}"',
        f'  elif [ "$_torchhpc_stop_reason" = time-limit ] && [ "$_torchhpc_n" -ge {cap} ]; then',
        f'    echo "torchhpc: not requeuing: --max-requeues {cap} used up"',
        "  else",
        '    [ "$_torchhpc_stop_reason" = time-limit ] && echo $((_torchhpc_n + 1)) > "$_torchhpc_timeouts_file"',
        '    echo "torchhpc: step exited $_torchhpc_rc after the $_torchhpc_stop_reason stop; requeuing job $SLURM_JOB_ID'
        ' (restart ${SLURM_RESTART_COUNT:-0} -> $((${SLURM_RESTART_COUNT:-0} + 1)))"',
        '    if scontrol requeue "$SLURM_JOB_ID"; then _torchhpc_end_state=REQUEUED',
        '    else echo "torchhpc: scontrol requeue failed" >&2; fi',
        "  fi",
        "fi",
        *unfinished_lines(),
    ]
