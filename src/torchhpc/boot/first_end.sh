#!/bin/bash
# torchhpc's first-end reader: the batch script's end trap runs it after a failed step
# (src/torchhpc/jobdir/endmark.py), so that the job ends with the code of the rank that failed first.
# - torchrun exits 1 whatever its worker's code; its "Root Cause (first observed failure)" block names
#   the worker's own ("exitcode  : 3", or -6 for SIGABRT: 134). The first such block counts, except one
#   of SIGTERM or SIGKILL: a rank a launcher stopped, not a cause.
# - srun exits with its tasks' highest status, so once --kill-on-bad-exit has stopped the other ranks
#   with SIGTERM (143) the failed rank's own code is hidden. srun's report of the task that ended first
#   gives it ("task 2: Exited with exit code 1": 1, "Aborted": 134); a first end of SIGTERM keeps RC.
# Otherwise (neither, or no report at all) it prints RC. Only lines after the last "torchhpc: job"
# banner count: a requeued job appends to its output. torchrun's lines may carry srun's --label ("0: ");
# srun's own never do (a rank's copy of one does not count).
# Usage: bash first_end.sh RC FILE...  (the first FILE that exists is read)
_rc=${1:?usage: first_end.sh RC FILE...}
shift
_f=""
for _f in "$@"; do [ -f "$_f" ] && break; done
_c="" _root="" _in=""
while IFS= read -r _l; do
  case $_l in [0-9]*": "*) _l=${_l#*: } ;; esac
  case $_l in
    "torchhpc: job "*) _c="" _root="" _in=""; continue ;;
    "Root Cause (first observed failure):"*) _in=1; continue ;;
    *"exitcode  : "*)
      _n=${_l#*: }; _n=${_n%% *}
      if [ -n "$_in" ] && [ -z "$_root" ]; then
        case $_n in -15 | -9 | '' | *[!0-9-]*) ;; -*) _root=$((128 - _n)) ;; *) _root=$_n ;; esac
      fi
      _in=""; continue ;;
  esac
  [ -z "$_c" ] || continue
  case ${_l##*: } in
    "Exited with exit code "*) _c=${_l##* } ;;
    Aborted*) _c=134 ;; "Segmentation fault"*) _c=139 ;; Killed*) _c=137 ;; "Bus error"*) _c=135 ;;
    "Floating point exception"*) _c=136 ;; "Illegal instruction"*) _c=132 ;; *) _c=$_rc ;;
  esac
done < <(grep -E '^(torchhpc: job |srun: error: [^ ]+: tasks? [0-9,-]+: |([0-9]+: )?(Root Cause \(first observed failure\):|  exitcode  : ))' \
  -- "$_f" 2>/dev/null)
_c=${_root:-$_c}
case $_c in '' | *[!0-9]*) _c=$_rc ;; esac
echo "$_c"
