#!/usr/bin/env bash
# Install torchhpc into ./.venv with PyTorch pinned (a bare `torch` would pull a multi-GB CUDA build).
# Usage: ./scripts/setup.sh [EXTRAS]   e.g. ./scripts/setup.sh dev   (TORCH_SPEC=torch==2.13.0 by default)
# The plot, function and diagnose extras (matplotlib, cloudpickle, py-spy: what the README's commands use) are always installed; EXTRAS adds to them.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
PY="${PYTHON:-python3}"
if ! "$PY" -m venv --help >/dev/null 2>&1 || ! "$PY" -c 'import ensurepip' >/dev/null 2>&1; then
  echo "setup: installing python3-venv" >&2
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv python3-pip
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
# Bytecode: pip compiles each package on one core after unpacking it (40 of the 73 s here); compileall on
# every core does it in 25, torch's part while pip installs the extras. Written once: imports only read it
# (where PYTHONDONTWRITEBYTECODE is set, nothing else would write it).
.venv/bin/python -m pip install -q --no-compile "$TORCH_SPEC" numpy  # numpy: torch warns on every import without it
SITE="$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
compile_site() { .venv/bin/python -m compileall -q -j 0 "$SITE" >/dev/null 2>&1 || true; }  # a package's test data that is no Python is no error
compile_site & compiling=$!
EXTRAS="plot,function,diagnose${1:+,$1}"  # every command of the README runs after this script alone (py-spy: named hangs and top; cloudpickle: Executor)
# Extras (lightning, ...) must never move torch: constrain it to what was just installed.
constraints="$(mktemp)"; trap 'rm -f "$constraints"' EXIT
.venv/bin/python -c 'import torch; print("torch==" + torch.__version__.split("+")[0])' > "$constraints"
.venv/bin/python -m pip install -q --no-compile -c "$constraints" -e ".${EXTRAS:+[$EXTRAS]}"
wait "$compiling"
compile_site  # the extras' packages (what torch's pass already compiled is skipped)
echo "setup: torchhpc $(.venv/bin/python -c 'import torchhpc; print(torchhpc.__version__)') with $(.venv/bin/python -c 'import torch; print("torch", torch.__version__)') in .venv" >&2
