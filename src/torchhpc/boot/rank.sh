#!/bin/bash
# torchhpc's rank-log wrapper: this rank's stdout and stderr appended to $TORCHHPC_RANKS_DIR/rank-N@NODE.log,
# then exec (signals reach the program directly). Usage: bash rank.sh "VAR1 VAR2..." COMMAND...
# N is the first set variable of the list (the launcher's rank variables). Without the directory (a script
# submitted by hand) the output stays on the launcher's stream; one that cannot be written is said once.
# The node is the kernel's host name: $HOSTNAME is inherited from the batch shell.
# PYTHONUNBUFFERED is defaulted: a file is block-buffered otherwise and `logs -f` would see lines late.
_torchhpc_rank=0
for _torchhpc_v in $1; do [ -z "${!_torchhpc_v:-}" ] || { _torchhpc_rank=${!_torchhpc_v}; break; }; done
shift
if [ -d "${TORCHHPC_RANKS_DIR:-}" ]; then
  read -r _torchhpc_host </proc/sys/kernel/hostname 2>/dev/null || _torchhpc_host=${SLURMD_NODENAME:-${HOSTNAME:-}}
  _torchhpc_log="$TORCHHPC_RANKS_DIR/rank-$_torchhpc_rank@${_torchhpc_host%%.*}.log"
  if : >>"$_torchhpc_log" 2>/dev/null; then exec >>"$_torchhpc_log" 2>&1
  else echo "torchhpc: cannot write $_torchhpc_log; rank $_torchhpc_rank's output stays here" >&2; fi
fi
unset _torchhpc_rank _torchhpc_v _torchhpc_host _torchhpc_log
: "${PYTHONUNBUFFERED:=1}"; export PYTHONUNBUFFERED
exec "$@"
