#!/bin/bash
# torchhpc's warm start for a Slurm job without the supervisor (sourced, not run): main() sources this file before
# its launch where each node runs two ranks or more of the job's Python (schedulers/slurm/launch.py), so that a
# node's ranks are forked from one standby interpreter that imported torch once (boot/warm.py), instead of each
# rank importing torch itself (1.5-3 CPU-s each, and a shared filesystem read as many times).
# Usage: . standby.sh PYTHON
# - The standby is a step of its own beside the job's (srun --overlap, named torchhpc-warm: the supervisor's
#   name for its standbys, supervisor/standby.py), one task per node; the end marker's trap ends it (end.sh).
# - A rank that comes before its node's standby is bound waits a moment; one that finds none starts cold, as a
#   rank of a script submitted by hand does (the task shim, task.sh).
# - TORCHHPC_WARM=off (0, false, no, none: core/units.py's words, held equal by a test) in the job's environment:
#   no standby, every rank imports torch itself.
_torchhpc_standby_on=${TORCHHPC_WARM:-on}
case ${_torchhpc_standby_on,,} in
  0 | false | no | off | none) ;;
  *)
    srun --overlap --job-name=torchhpc-warm --nodes="$SLURM_JOB_NUM_NODES" --ntasks="$SLURM_JOB_NUM_NODES" \
      --ntasks-per-node=1 --kill-on-bad-exit=0 --quiet \
      "$1" "$TORCHHPC_BOOT_DIR/warm.py" serve "torchhpc-warm-$SLURM_JOB_ID" torch >/dev/null 2>&1 &
    _torchhpc_standby=$!
    export TORCHHPC_WARM_STANDBY="torchhpc-warm-$SLURM_JOB_ID" TORCHHPC_WARM_PYTHON="$1"
    ;;
esac
