#!/bin/bash
# torchhpc's end marker (sourced, not run): a batch script sources this file before main() (src/torchhpc/jobdir/endmark.py), so
# that the job's end lands in <DIR>/end.json from the EXIT trap, also after a failure or a cancel: clients wait
# on that file instead of asking the controller every second (docs/script.md).
# Usage: . end.sh [--stop-protocol] DIR RESTART [FILE...]
# - DIR: the job's directory; the marker is written only where it exists (a script submitted by hand has none).
#   An earlier run's marker is removed now. RESTART: the scheduler's restart count, as the batch shell sees it.
# - Without --stop-protocol, SIGTERM (the scheduler ending the job) exits 143, so that the EXIT trap runs and
#   says CANCELLED. With it, the script traps SIGTERM itself, and the protocol's files (the stop request, a
#   rank's word it took it, the time-limit count) end with the job.
# - FILE...: the batch output where the launcher reported its ranks' ends (the first that exists is read; a
#   bare name is in DIR). The launcher's status hides the failed rank's own code: srun exits with its tasks'
#   highest status (143 once --kill-on-bad-exit stopped the others), torchrun with 1. first_end.sh finds the
#   code of the rank that failed first, and the job ends with it: marker and shell (hence sacct's ExitCode).
# A requeue from the script sets _torchhpc_end_state=REQUEUED: no marker, the job goes on. SIGKILL leaves
# none: the client learns that end from the scheduler, at its next (backed-off) question.
_torchhpc_end_stop=""
if [ "${1:-}" = --stop-protocol ]; then _torchhpc_end_stop=1; shift; fi
_torchhpc_end_dir=${1:?usage: . end.sh [--stop-protocol] DIR RESTART [FILE...]} _torchhpc_end_restart=${2:-0}
shift 2
_torchhpc_end_files=()
for _torchhpc_f in "$@"; do
  case $_torchhpc_f in */*) ;; *) _torchhpc_f=$_torchhpc_end_dir/$_torchhpc_f ;; esac
  _torchhpc_end_files+=("$_torchhpc_f")
done
_torchhpc_end_state=""

_torchhpc_end() {
  local _rc=$1 _d=$_torchhpc_end_dir _s=${_torchhpc_end_state:-COMPLETED} _t=${EPOCHREALTIME:-$(date +%s)} _own=
  set +eu
  if [ -n "${_torchhpc_standby:-}" ]; then kill "$_torchhpc_standby" 2>/dev/null; fi  # the warm standbys (standby.sh)
  if [ "$_s" = REQUEUED ]; then return 0; fi
  if [ -n "$_torchhpc_end_stop" ]; then
    rm -f -- ${TORCHHPC_STOP_FILE:+"$TORCHHPC_STOP_FILE" "$TORCHHPC_STOP_FILE.taken"} \
      ${_torchhpc_timeouts_file:+"$_torchhpc_timeouts_file"} 2>/dev/null
  fi
  case ${_torchhpc_stop_reason:-} in ended-by-slurm | terminated) _s=CANCELLED ;; esac
  if [ "$_s" = COMPLETED ] && [ "$_rc" -ne 0 ]; then
    _s=FAILED
    if [ ${#_torchhpc_end_files[@]} -gt 0 ]; then
      _own=$(bash "${TORCHHPC_BOOT_DIR:-.}/first_end.sh" "$_rc" "${_torchhpc_end_files[@]}" 2>/dev/null)
    fi
  fi
  if [ -d "$_d" ]; then
    printf '{"state": "%s", "exit_code": %d, "time": %s, "restart": %d}\n' \
      "$_s" "${_own:-$_rc}" "${_t/,/.}" "$_torchhpc_end_restart" >"$_d/.end.json.$$" 2>/dev/null \
      && mv -f -- "$_d/.end.json.$$" "$_d/end.json" 2>/dev/null
  fi
  if [ -n "$_own" ] && [ "$_own" != "$_rc" ]; then exit "$_own"; fi  # the shell's status too
  return 0
}

rm -f -- "$_torchhpc_end_dir/end.json"
trap '_torchhpc_end $?' EXIT
if [ -z "$_torchhpc_end_stop" ]; then trap '_torchhpc_end_state=CANCELLED; exit 143' TERM; fi
