#!/bin/bash
# torchhpc's first-end reader: the batch script's end trap runs it after a failed srun step
# (src/torchhpc/jobdir/endmark.py). srun exits with its tasks' highest status, so once --kill-on-bad-exit
# has stopped the other ranks with SIGTERM (143) the failed rank's own code is hidden. This prints the code
# of the task srun reported ending first, in srun's words ("task 2: Exited with exit code 1": 1, "Aborted":
# 134), or RC when the first end was a SIGTERM, or there is none. Only lines after the last "torchhpc: job"
# banner count: a requeued job appends to its output.
# Usage: bash first_end.sh RC FILE...  (the first FILE that exists is read)
_rc=${1:?usage: first_end.sh RC FILE...}
shift
_f=""
for _f in "$@"; do [ -f "$_f" ] && break; done
_c=""
while IFS= read -r _l; do
  case $_l in "torchhpc: job "*) _c=""; continue ;; esac
  [ -z "$_c" ] || continue
  case ${_l##*: } in
    "Exited with exit code "*) _c=${_l##* } ;;
    Aborted*) _c=134 ;; "Segmentation fault"*) _c=139 ;; Killed*) _c=137 ;; "Bus error"*) _c=135 ;;
    "Floating point exception"*) _c=136 ;; "Illegal instruction"*) _c=132 ;; *) _c=$_rc ;;
  esac
done < <(grep -E '^(torchhpc: job |srun: error: [^ ]+: tasks? [0-9,-]+: )' -- "$_f" 2>/dev/null)
case $_c in '' | *[!0-9]*) _c=$_rc ;; esac
echo "$_c"
