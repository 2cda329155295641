# torchhpc's boot writer (launchers/boot.py boot_shell): POSIX sh that writes the boot directory's
# sitecustomize.py, once per node and version, and puts it first on PYTHONPATH. A rank that no shim starts
# (a container of the local scheduler) runs it before its command: sh -c THIS; exec "$@" (boot_argv).
# A template, not a program of the boot directory: it makes a copy's sitecustomize.py and travels with none.
# boot_shell() drops these comment lines and fills in two placeholders: the line @SITECUSTOMIZE_PY@ with
# boot/sitecustomize.py (a quoted heredoc: nothing in it expands), @BOOT_HASH@ with boot_hash() (the content's name).
# Safe under set -e: a directory that cannot be made or is not the user's costs the cure (one line on
# stderr), never the rank; it is used only if the rank's user owns it, renamed into place (ranks race).
# SC3028: ${UID:-$(id -u)} asks id where the shell has no UID. SC2015: after &&, || : is meant (either fails: no cure).
# shellcheck shell=sh disable=SC3028,SC2015
if [ "${TORCHHPC_EXIT_CURE:-1}" != 0 ]; then
  _torchhpc_b=${TMPDIR:-/tmp}; { [ -d "$_torchhpc_b" ] && [ -w "$_torchhpc_b" ]; } || _torchhpc_b=/tmp
  _torchhpc_b=$_torchhpc_b/torchhpc-boot-${UID:-$(id -u)}-@BOOT_HASH@
  if [ ! -f "$_torchhpc_b/sitecustomize.py" ]; then
    mkdir -m 700 "$_torchhpc_b" 2>/dev/null || :
    if [ -O "$_torchhpc_b" ] && [ ! -L "$_torchhpc_b" ]; then
      { cat > "$_torchhpc_b/.sitecustomize.$$" <<\TORCHHPC_BOOT_PY
@SITECUSTOMIZE_PY@
TORCHHPC_BOOT_PY
      } 2>/dev/null && mv -f "$_torchhpc_b/.sitecustomize.$$" "$_torchhpc_b/sitecustomize.py" 2>/dev/null || :
    fi
  fi
  if [ -O "$_torchhpc_b" ] && [ ! -L "$_torchhpc_b" ] && [ -f "$_torchhpc_b/sitecustomize.py" ]; then
    export PYTHONPATH="$_torchhpc_b${PYTHONPATH:+:$PYTHONPATH}"
  else
    echo "torchhpc: no exit cure in this rank: cannot write $_torchhpc_b as this user" >&2
  fi
fi
